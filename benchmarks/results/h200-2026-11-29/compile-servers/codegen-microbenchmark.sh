#!/usr/bin/env bash
# Exploratory: NVRTC per-kernel time, threads in one process against separate processes,
# with the driver's compute cache (which NVRTC 13 uses) off, fresh, and warm.
set -u
tar -C target -xJf target/device-pack/device.tar.xz
B=$PWD/target/device/tilesched
R=$OUT/nvrtc; mkdir -p $R
mapfile -t S < <($B workloads --network resnet | awk '!/^#/ {print $2}')
export CUDA_CACHE_MAXSIZE=4294967296
run_threads() { # T NAME [shapes...]
  local t=$1 n=$2; shift 2; local t0=$(date +%s%N)
  for i in "$@"; do RAYON_NUM_THREADS=$t $B codegen conv2d --shape "${S[$i]}" --sample 16 --compile sm_90 --out /tmp/$n/$i >/dev/null; done
  echo "$n wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $R/summary.txt
}
run_procs() { # NAME
  local t0=$(date +%s%N)
  for i in "${!S[@]}"; do RAYON_NUM_THREADS=1 $B codegen conv2d --shape "${S[$i]}" --sample 16 --compile sm_90 --out /tmp/$1/$i >/dev/null & done
  wait
  echo "$1 wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $R/summary.txt
}
ALL=$(seq 0 12)
CUDA_CACHE_DISABLE=1 run_threads 1 t1-off 0 2 5 8
CUDA_CACHE_DISABLE=1 run_threads 16 t16-off $ALL
CUDA_CACHE_DISABLE=1 run_procs p13-off
CUDA_CACHE_PATH=/tmp/cc1 run_threads 16 t16-fresh $ALL
CUDA_CACHE_PATH=/tmp/cc1 run_threads 16 t16-warm $ALL
CUDA_CACHE_PATH=/tmp/cc2 run_procs p13-fresh
CUDA_CACHE_DISABLE=1 run_threads 4 t4-off $ALL
du -sh /tmp/cc1 /tmp/cc2 | tee -a $R/summary.txt
python3 - <<'PY' | tee -a $R/summary.txt
import json,glob,statistics as st
base={}
for name in ["t1-off","t16-off","p13-off","t16-fresh","t16-warm","p13-fresh","t4-off"]:
    d={}
    for f in glob.glob(f"/tmp/{name}/*/manifest.json"):
        m=json.load(open(f))
        for k in m["kernels"]:
            if "compile_ms" in k.get("compile",{}): d[(m["task_key"],k["state_id"])]=k["compile"]["compile_ms"]
    ms=list(d.values())
    line=f"{name}: {len(ms)} kernels, median {st.median(ms):.0f} ms, mean {st.mean(ms):.0f} ms, sum {sum(ms)/1e3:.1f} s"
    if name=="t1-off": base=d
    else:
        common=[k for k in d if k in base]
        if common: line+=f"; on t1-off's {len(common)}: median ratio {st.median(d[k]/base[k] for k in common):.2f}"
    print(line)
PY
