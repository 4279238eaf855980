# Issue 30 experiment (hand-written, not the project's code): can the 3-channel ResNet
# stem (7x7 stride 2 pad 3, 3 -> 64, fp16 NHWC) run far faster than cuDNN if each block
# stages its input rows raw (16-byte loads of whole 672-element rows, borders zeroed)
# and gathers mma.sync A fragments from them with 32-bit shared loads (a tap row's 21
# (s, c) values at k = 1..21 behind a zero weight at k = 0, so every pair is aligned)?
# One block per output row: 7 warps x 16 pixels x 64 channels. Checked exactly against
# PyTorch on integer data, then timed cold-L2 against torch's conv2d (cuDNN) per launch.
import sys, cupy as cp, torch, numpy as np
src = r'''
#include <cuda_fp16.h>
extern "C" __global__ void __launch_bounds__(224) stem(const __half* __restrict__ x, const __half* __restrict__ w, __half* __restrict__ y, int rows_per_block) {
  __shared__ __align__(16) __half span[7][704];
  __shared__ __align__(16) __half wt[7][64][40];   // k padded to 40 halves: 80-byte rows, fewer bank conflicts
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // weights: wt[r][n][k] = w[n][r][s][c] with k = 1 + s*3 + c, zero elsewhere
  for (int i = tid; i < 7 * 64 * 32; i += 224) {
    int k = i % 32, n = (i / 32) % 64, r = i / 2048;
    __half v = __float2half(0.f);
    if (k >= 1 && k <= 21) v = w[((n * 7 + r) * 7) * 3 + (k - 1)];
    wt[r][n][k] = v;
  }
  for (int rb = 0; rb < rows_per_block; ++rb) {
    const int row = blockIdx.x * rows_per_block + rb;          // image * 112 + oh
    const int img = row / 112, oh = row % 112;
    __syncthreads();
    // input rows ih = 2*oh - 3 + r, elements x at span[r][x + 16], zero outside the image
    for (int i = tid; i < 7 * 88; i += 224) {
      int r = i / 88, v = i % 88;                               // 88 vectors of 8 halves per row
      int ih = 2 * oh - 3 + r, x0 = v * 8 - 16;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (ih >= 0 && ih < 224 && x0 >= 0 && x0 < 672)
        val = *reinterpret_cast<const uint4*>(x + ((size_t)img * 224 + ih) * 672 + x0);
      *reinterpret_cast<uint4*>(&span[r][v * 8]) = val;
    }
    __syncthreads();
    float acc[8][4];
    #pragma unroll
    for (int j = 0; j < 8; ++j) for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    const int g = lane / 4, q = lane % 4;
    const int ow0 = warp * 16 + g, ow1 = ow0 + 8;
    #pragma unroll
    for (int r = 0; r < 7; ++r) {
      #pragma unroll
      for (int kk = 0; kk < 32; kk += 16) {
        // A[ow][k] = span[r][6*ow + 6 + k]
        unsigned a0 = *reinterpret_cast<const unsigned*>(&span[r][6 * ow0 + 6 + kk + 2 * q]);
        unsigned a1 = *reinterpret_cast<const unsigned*>(&span[r][6 * ow1 + 6 + kk + 2 * q]);
        unsigned a2 = *reinterpret_cast<const unsigned*>(&span[r][6 * ow0 + 6 + kk + 2 * q + 8]);
        unsigned a3 = *reinterpret_cast<const unsigned*>(&span[r][6 * ow1 + 6 + kk + 2 * q + 8]);
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int n = j * 8 + g;
          unsigned b0 = *reinterpret_cast<const unsigned*>(&wt[r][n][kk + 2 * q]);
          unsigned b1 = *reinterpret_cast<const unsigned*>(&wt[r][n][kk + 2 * q + 8]);
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
      }
    }
    // c0,c1: pixel ow0, channels 8j + 2q, +1; c2,c3: pixel ow1
    __half* out0 = y + ((size_t)row * 112 + ow0) * 64;
    __half* out1 = y + ((size_t)row * 112 + ow1) * 64;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<__half2*>(out0 + j * 8 + 2 * q) = __floats2half2_rn(acc[j][0], acc[j][1]);
      *reinterpret_cast<__half2*>(out1 + j * 8 + 2 * q) = __floats2half2_rn(acc[j][2], acc[j][3]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(224) stem2(const __half* __restrict__ x, const __half* __restrict__ w, __half* __restrict__ y, int rows) {
  extern __shared__ __align__(16) unsigned char smem[];
  __half (*span)[7][704] = reinterpret_cast<__half (*)[7][704]>(smem);            // two buffers
  __half (*wt)[64][40] = reinterpret_cast<__half (*)[64][40]>(smem + 2 * 7 * 704 * 2);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < 7 * 64 * 32; i += 224) {
    int k = i % 32, n = (i / 32) % 64, r = i / 2048;
    __half v = __float2half(0.f);
    if (k >= 1 && k <= 21) v = w[((n * 7 + r) * 7) * 3 + (k - 1)];
    wt[r][n][k] = v;
  }
  auto issue = [&](int row, int buf) {
    const int img = row / 112, oh = row % 112;
    for (int i = tid; i < 7 * 88; i += 224) {
      int r = i / 88, v = i % 88;
      int ih = 2 * oh - 3 + r, x0 = v * 8 - 16;
      bool ok = ih >= 0 && ih < 224 && x0 >= 0 && x0 < 672;
      const __half* src = ok ? x + ((size_t)img * 224 + ih) * 672 + x0 : x;
      unsigned dst = (unsigned)__cvta_generic_to_shared(&span[buf][r][v * 8]);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  int buf = 0;
  if (blockIdx.x < rows) issue(blockIdx.x, 0);
  for (int row = blockIdx.x; row < rows; row += gridDim.x, buf ^= 1) {
    const int next = row + gridDim.x;
    if (next < rows) issue(next, buf ^ 1);
    else asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    float acc[8][4];
    #pragma unroll
    for (int j = 0; j < 8; ++j) for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    const int g = lane / 4, q = lane % 4;
    const int ow0 = warp * 16 + g, ow1 = ow0 + 8;
    #pragma unroll
    for (int r = 0; r < 7; ++r) {
      #pragma unroll
      for (int kk = 0; kk < 32; kk += 16) {
        unsigned a0 = *reinterpret_cast<const unsigned*>(&span[buf][r][6 * ow0 + 6 + kk + 2 * q]);
        unsigned a1 = *reinterpret_cast<const unsigned*>(&span[buf][r][6 * ow1 + 6 + kk + 2 * q]);
        unsigned a2 = *reinterpret_cast<const unsigned*>(&span[buf][r][6 * ow0 + 6 + kk + 2 * q + 8]);
        unsigned a3 = *reinterpret_cast<const unsigned*>(&span[buf][r][6 * ow1 + 6 + kk + 2 * q + 8]);
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int n = j * 8 + g;
          unsigned b0 = *reinterpret_cast<const unsigned*>(&wt[r][n][kk + 2 * q]);
          unsigned b1 = *reinterpret_cast<const unsigned*>(&wt[r][n][kk + 2 * q + 8]);
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
      }
    }
    __half* out0 = y + ((size_t)row * 112 + ow0) * 64;
    __half* out1 = y + ((size_t)row * 112 + ow1) * 64;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<__half2*>(out0 + j * 8 + 2 * q) = __floats2half2_rn(acc[j][0], acc[j][1]);
      *reinterpret_cast<__half2*>(out1 + j * 8 + 2 * q) = __floats2half2_rn(acc[j][2], acc[j][3]);
    }
    __syncthreads();   // every warp is done with this buffer before it is refilled
  }
}
extern "C" __global__ void __launch_bounds__(224) stem3(const __half* __restrict__ x, const __half* __restrict__ w, __half* __restrict__ y, int rows) {
  extern __shared__ __align__(16) unsigned char smem[];
  __half (*span)[7][704] = reinterpret_cast<__half (*)[7][704]>(smem);            // two buffers
  __half (*wt)[64][40] = reinterpret_cast<__half (*)[64][40]>(smem + 2 * 7 * 704 * 2);
  __half (*orow)[72] = reinterpret_cast<__half (*)[72]>(smem + 2 * 7 * 704 * 2 + 7 * 64 * 40 * 2);  // 112 pixels x 64 channels (+8 pad)
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < 7 * 64 * 32; i += 224) {
    int k = i % 32, n = (i / 32) % 64, r = i / 2048;
    __half v = __float2half(0.f);
    if (k >= 1 && k <= 21) v = w[((n * 7 + r) * 7) * 3 + (k - 1)];
    wt[r][n][k] = v;
  }
  auto issue = [&](int row, int buf) {
    const int img = row / 112, oh = row % 112;
    for (int i = tid; i < 7 * 88; i += 224) {
      int r = i / 88, v = i % 88;
      int ih = 2 * oh - 3 + r, x0 = v * 8 - 16;
      bool ok = ih >= 0 && ih < 224 && x0 >= 0 && x0 < 672;
      const __half* src = ok ? x + ((size_t)img * 224 + ih) * 672 + x0 : x;
      unsigned dst = (unsigned)__cvta_generic_to_shared(&span[buf][r][v * 8]);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  int buf = 0;
  if (blockIdx.x < rows) issue(blockIdx.x, 0);
  for (int row = blockIdx.x; row < rows; row += gridDim.x, buf ^= 1) {
    const int next = row + gridDim.x;
    if (next < rows) issue(next, buf ^ 1);
    else asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    float acc[8][4];
    #pragma unroll
    for (int j = 0; j < 8; ++j) for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    const int g = lane / 4, q = lane % 4;
    const int ow0 = warp * 16 + g, ow1 = ow0 + 8;
    #pragma unroll
    for (int r = 0; r < 7; ++r) {
      #pragma unroll
      for (int kk = 0; kk < 32; kk += 16) {
        unsigned a0 = *reinterpret_cast<const unsigned*>(&span[buf][r][6 * ow0 + 6 + kk + 2 * q]);
        unsigned a1 = *reinterpret_cast<const unsigned*>(&span[buf][r][6 * ow1 + 6 + kk + 2 * q]);
        unsigned a2 = *reinterpret_cast<const unsigned*>(&span[buf][r][6 * ow0 + 6 + kk + 2 * q + 8]);
        unsigned a3 = *reinterpret_cast<const unsigned*>(&span[buf][r][6 * ow1 + 6 + kk + 2 * q + 8]);
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int n = j * 8 + g;
          unsigned b0 = *reinterpret_cast<const unsigned*>(&wt[r][n][kk + 2 * q]);
          unsigned b1 = *reinterpret_cast<const unsigned*>(&wt[r][n][kk + 2 * q + 8]);
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
      }
    }
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<__half2*>(&orow[ow0][j * 8 + 2 * q]) = __floats2half2_rn(acc[j][0], acc[j][1]);
      *reinterpret_cast<__half2*>(&orow[ow1][j * 8 + 2 * q]) = __floats2half2_rn(acc[j][2], acc[j][3]);
    }
    __syncthreads();
    // the row's 112 x 128 bytes are contiguous in the output: 896 vectors of 16 bytes
    for (int i = tid; i < 112 * 8; i += 224) {
      int p = i / 8, v = i % 8;
      *reinterpret_cast<uint4*>(y + ((size_t)row * 112 + p) * 64 + v * 8) = *reinterpret_cast<const uint4*>(&orow[p][v * 8]);
    }
    __syncthreads();   // every warp is done with this buffer before it is refilled
  }
}
'''
mod = cp.RawModule(code=src, options=('--std=c++17', '-arch=sm_90'))
kern = mod.get_function('stem')
kern2 = mod.get_function('stem2')
SMEM2 = 2 * 7 * 704 * 2 + 7 * 64 * 40 * 2
kern2.max_dynamic_shared_size_bytes = SMEM2
kern3 = mod.get_function('stem3')
SMEM3 = SMEM2 + 112 * 72 * 2
kern3.max_dynamic_shared_size_bytes = SMEM3
dev = torch.device('cuda')
print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())
flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)
def cold_time(fn, reps=50):
    ts = []
    for _ in range(reps):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1000)
    return float(np.median(ts))
for n in [1, 8]:
    g = torch.Generator(device='cpu').manual_seed(5)
    x = torch.randint(-2, 3, (n, 224, 224, 3), generator=g).half().to(dev)
    w = torch.randint(-2, 3, (64, 7, 7, 3), generator=g).half().to(dev)
    ref = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2).float(), w.permute(0, 3, 1, 2).float(), stride=2, padding=3).permute(0, 2, 3, 1).contiguous()
    for rpb in [1, 2, 4]:
        y = torch.empty(n, 112, 112, 64, dtype=torch.half, device=dev)
        blocks = n * 112 // rpb
        call = lambda: kern((blocks,), (224,), (cp.asarray(x), cp.asarray(w), cp.asarray(y), np.int32(rpb)))
        call(); torch.cuda.synchronize()
        exact = torch.equal(y.float(), ref)
        us = cold_time(call)
        print(f'n={n} rows/block={rpb}: exact={exact} {us:.2f} us')
    for blocks in [56, 112, 132, 264, 396]:
        rows = n * 112
        if blocks > rows: continue
        y = torch.empty(n, 112, 112, 64, dtype=torch.half, device=dev)
        call = lambda: kern2((blocks,), (224,), (cp.asarray(x), cp.asarray(w), cp.asarray(y), np.int32(rows)), shared_mem=SMEM2)
        call(); torch.cuda.synchronize()
        exact = torch.equal(y.float(), ref)
        print(f'n={n} persistent {blocks} blocks, double-buffered: exact={exact} {cold_time(call):.2f} us')
        y = torch.empty(n, 112, 112, 64, dtype=torch.half, device=dev)
        call = lambda: kern3((blocks,), (224,), (cp.asarray(x), cp.asarray(w), cp.asarray(y), np.int32(rows)), shared_mem=SMEM3)
        call(); torch.cuda.synchronize()
        exact = torch.equal(y.float(), ref)
        print(f'n={n} persistent {blocks} blocks, double-buffered, staged stores: exact={exact} {cold_time(call):.2f} us')
    xc = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    wc = w.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    f = lambda: torch.nn.functional.conv2d(xc, wc, stride=2, padding=3)
    for _ in range(5): f()
    torch.cuda.synchronize()
    print(f'n={n} torch conv2d (cuDNN, channels_last fp16): {cold_time(f):.2f} us')
