# Experiment only (not project code): rewrite a wgmma kernel's epilogue.
# v1: staged through swizzled shared memory, 16-byte coalesced stores.
# v2: staged the same way, written by TMA stores (two buffers per warpgroup).
import json, re, sys
src, variant, out = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(src).read()
lines = text.split("\n")
i0 = next(i for i, l in enumerate(lines) if "const int lane_row" in l)
ist = next(i for i in range(i0, len(lines)) if "reinterpret_cast<unsigned*>(&out[" in lines[i])
i1 = ist + 1
assert lines[i1].strip() == "}", lines[i1]
m0 = re.search(r"lane_row = (\w+) \+", lines[i0]).group(1)
n0 = re.search(r"lane_col = (\w+) \+", lines[i0 + 1]).group(1)
N = int(re.search(r"\* (\d+) \+ out_n\]", lines[ist]).group(1))
M = int(sys.argv[4])
ring = int(re.search(r"dynamic shared memory (\d+) bytes", text).group(1))
ind = " " * (len(lines[i0]) - len(lines[i0].lstrip()))
# Each thread: rows r, r+8 of its warpgroup's 64; columns c, c+1 of each 8-column group.
common = f"""{ind}const int ep_t = (int)threadIdx.x % 128;
{ind}const int ep_r = (ep_t / 32) * 16 + (ep_t / 4) % 8;
{ind}const int ep_c = (ep_t % 4) * 2;
{ind}const int ep_m = {m0} + warpgroup * 64;
"""
def sts(buf):
    return f"""{ind}  #pragma unroll
{ind}  for (int q = 0; q < 16; ++q) {{
{ind}    const int e = j * 16 + q;
{ind}    const int row = ep_r + (e % 2) * 8;
{ind}    const int col = ep_c + (q / 2) * 8;
{ind}    const unsigned at = {buf} + row * 128 + ((((col * 2) / 16) ^ (row % 8)) * 16) + (col * 2) % 16;
{ind}    const unsigned v = (unsigned)ts_from_f32(acc[e * 2]) | ((unsigned)ts_from_f32(acc[e * 2 + 1]) << 16);
{ind}    asm volatile("st.shared.b32 [%0], %1;" :: "r"(at), "r"(v) : "memory");
{ind}  }}
"""
bar = f'{ind}  asm volatile("bar.sync %0, 128;" :: "r"(1 + warpgroup) : "memory");\n'
if variant == "v1":
    stage = f"shared_base + {ring} + warpgroup * 8192"
    body = common + f"""{ind}const unsigned ep_buf = {stage};
{ind}#pragma unroll
{ind}for (int j = 0; j < 4; ++j) {{
{bar}{sts('ep_buf')}{bar}{ind}  #pragma unroll
{ind}  for (int p = 0; p < 4; ++p) {{
{ind}    const int idx = p * 128 + ep_t;
{ind}    const int row = idx / 8, ch = idx % 8;
{ind}    uint4 v;
{ind}    asm volatile("ld.shared.v4.b32 {{%0, %1, %2, %3}}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(ep_buf + row * 128 + ((ch ^ (row % 8)) * 16)) : "memory");
{ind}    if (ep_m + row < {M}) *reinterpret_cast<uint4*>(&out[(ep_m + row) * {N} + {n0} + j * 64 + ch * 8]) = v;
{ind}  }}
{ind}}}"""
    extra = 8192 * 2
else:
    stage = f"shared_base + {ring} + warpgroup * 16384"
    body = common + f"""{ind}#pragma unroll
{ind}for (int j = 0; j < 4; ++j) {{
{ind}  const unsigned ep_buf = {stage} + (j % 2) * 8192;
{ind}  if (ep_t == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
{bar}{sts('ep_buf')}{ind}  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
{bar}{ind}  if (ep_t == 0) {{
{ind}    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {{%2, %3}}], [%1];" :: "l"((unsigned long long)&c_map), "r"(ep_buf), "r"({n0} + j * 64), "r"(ep_m) : "memory");
{ind}    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
{ind}  }}
{ind}}}"""
    extra = 16384 * 2
lines[i0:i1 + 1] = body.split("\n")
text = "\n".join(lines)
if variant == "v2":
    text = text.replace("const __grid_constant__ TmaMap b_map)", "const __grid_constant__ TmaMap b_map, const __grid_constant__ TmaMap c_map)")
    # Every thread that issued stores waits for them before the block exits.
    k = text.rstrip().rfind("}")
    text = text[:k] + '  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");\n}\n'
open(out, "w").write(text)
side = json.load(open(src + ".json"))
side["format"] = "cubin"
side["dynamic_shared_bytes"] = ring + extra
if variant == "v2":
    side["tensor_maps"].append({"buffer": 2, "tensor": {"dtype": "fp16", "dims": [N, M], "strides": [N * 2], "boxed": [64, 64], "swizzle": "b128"}})
json.dump(side, open(out.replace(".cu", ".cubin") + ".json", "w"), indent=1)
