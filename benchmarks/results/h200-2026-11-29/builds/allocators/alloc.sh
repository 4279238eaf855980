# Issue 51: are NVRTC builds on many threads of one process slowed by the allocator
# (page faults, memory handed back to the kernel and faulted in again)? One H200 host.
# Builds with glibc's malloc as is, glibc keeping its memory (MALLOC_*_THRESHOLD_),
# jemalloc and mimalloc (LD_PRELOAD, Debian's builds carried in target/alloc).
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib CUDA_CACHE_DISABLE=1
B=$TILESCHED_BIN
R=$OUT/alloc; mkdir -p $R
{ nproc; lscpu; uname -r; cat /sys/kernel/mm/transparent_hugepage/enabled; free -g; } > $R/machine.txt 2>&1
A=$PWD/target/alloc
declare -A CFG=(
  [glibc]="X=1"
  [glibc-keep]="MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=67108864"
  [jemalloc]="LD_PRELOAD=$A/libjemalloc.so.2"
  [mimalloc]="LD_PRELOAD=$A/libmimalloc.so.2.0"
)
mapfile -t S < <($B workloads --network resnet | awk '!/^#/ {print $2}')
TIMEFORMAT="%R s wall, %U s user, %S s system"
micro() { # NAME THREADS SAMPLES TASK...
  local n=$1 t=$2 k=$3; shift 3
  rm -rf /tmp/m-$n
  { time (for i in "$@"; do env ${CFG[${n%%.*}]} RAYON_NUM_THREADS=$t $B codegen conv2d --shape "${S[$i]}" --sample $k --seed 7 --compile sm_90 --out /tmp/m-$n/$i >/dev/null; done) ; } 2>> $R/micro-time.txt
  echo "$n: $(tail -1 $R/micro-time.txt)" | tee -a $R/micro.txt
}
micro glibc.t1 1 12 2 5 8 11
for round in 1 2; do
  for c in glibc glibc-keep jemalloc mimalloc; do micro $c.t16.$round 16 64 2 5 8 11; done
done
python3 - <<'PY' | tee -a $R/micro.txt
import json,glob,statistics as st,collections
base={}
for d in sorted(glob.glob("/tmp/m-*")):
    name=d[7:]; v={}
    for f in glob.glob(d+"/*/manifest.json"):
        m=json.load(open(f))
        for k in m["kernels"]:
            c=k.get("compile",{})
            if "compile_ms" in c: v[(m["task_key"],k["state_id"])]=c["compile_ms"]
    if name=="glibc.t1": base=v
    ms=list(v.values()); common=[k for k in v if k in base]
    r=f"; on the t1 set's {len(common)}: median ratio {st.median(v[k]/base[k] for k in common):.2f}" if common and name!="glibc.t1" else ""
    print(f"{name}: {len(ms)} kernels, median {st.median(ms):.0f} ms, mean {st.mean(ms):.0f} ms{r}")
PY
run() { # NAME CONFIG tune-flags...: 1536 resnet f32 trials, tune's defaults, fresh caches
  local n=$1 c=$2; shift 2
  rm -rf /tmp/$n.jsonl /tmp/cubins-$n
  env ${CFG[$c]} timeout 150 $B tune conv2d --network resnet --trials 1536 --log /tmp/$n.jsonl --cubin-cache /tmp/cubins-$n "$@" > $R/$n.txt 2> $R/$n-stderr.txt
  echo "exit $?" >> $R/$n.txt; echo "$n: $(grep -E '^wall|^CPU|^busy' $R/$n.txt | tr '\n' ' ')" | tee -a $R/summary.txt
}
export TILESCHED_SIMULATED_MEASURE_MS=17
for c in glibc mimalloc glibc-keep; do run sim4-$c $c --simulate --device 0,1,2,3; done
unset TILESCHED_SIMULATED_MEASURE_MS
for c in glibc mimalloc; do run gpu1-$c $c --device 0; done
