set -u
# Issue 30: is the small-tile wgmma conv kernel bound by its ring or by im2col TMA?
# (1) one l7 / l14 b8 state at several ring depths (up to 16 stages, a build with
# MAX_WGMMA_STAGES = 16); (2) the same GEMM as l7 as a matmul (tiled TMA, no im2col);
# (3) Nsight Compute on the 64x64 8-stage conv state and on the matmul state.
. target/device-pack/common0.sh
E=target/device-pack/exp2
T="--dtype fp16 --out-dtype fp16 --layout nhwc"
V="--algorithms 1 --engines 1 --handles 0 --conv-gemm-algorithms 0"
mkdir -p $OUT/x
for f in $E/l*.jsonl; do
  n=$(basename $f .jsonl)
  case $n in l7*) S=8,512,7,7,512,3,3,1,1;; *) S=8,256,14,14,256,3,3,1,1;; esac
  timeout 60 $B bench conv2d --shape $S $T --log $f --out /tmp/b-$n --rounds 2 --min-time-ms 20 $V > $OUT/x/$n-bench.txt 2>&1
  echo "$n: $(grep -E 'ours .*vendor' $OUT/x/$n-bench.txt | cut -d: -f2-)"
done
timeout 90 $B bench matmul --shape 392,512,4608 --dtype fp16 --out-dtype fp16 --log $E/mm-l7-64x64-s8.jsonl --out /tmp/b-mm --rounds 2 --min-time-ms 20 > $OUT/x/mm-bench.txt 2>&1
echo "mm: $(grep -E 'ours .*vendor' $OUT/x/mm-bench.txt | cut -d: -f2-)"
prof() { # name op shape log
  local name=$1 op=$2 shape=$3 log=$4 extra=""
  [ $op = conv2d ] && extra="$T $V"
  [ $op = matmul ] && extra="--dtype fp16 --out-dtype fp16"
  timeout 150 ncu --clock-control none --kernel-name-base function --kernel-name "regex:^(conv2d_|matmul_)" --launch-skip 2 --launch-count 1 \
    --set full --import-source no -o $OUT/x/$name -f \
    $B bench $op --shape $shape $extra --log $log --out /tmp/pb-$name --rounds 1 --min-time-ms 1 --min-repeats 3 > $OUT/x/$name-ncu-run.txt 2>&1
  echo "$name ncu exit $?"
  ncu -i $OUT/x/$name.ncu-rep --page details --print-details all > $OUT/x/$name-details.txt 2>&1
  ncu -i $OUT/x/$name.ncu-rep --page source --csv --print-source sass > /tmp/src-$name.csv 2>/dev/null
  python3 - /tmp/src-$name.csv > $OUT/x/$name-stalls.txt <<'PY'
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
h=None
for i,r in enumerate(rows):
    if any('Warp Stall Sampling (All' in c for c in r): h=i;break
if h is None: print('no header'); sys.exit()
hd=rows[h]; data=rows[h+1:]
col=[j for j,c in enumerate(hd) if c.startswith('Warp Stall Sampling (All')][0]
src=[j for j,c in enumerate(hd) if c=='Source'][0]
def num(x):
    try: return float(x.replace(',',''))
    except: return 0
tot=sum(num(r[col]) for r in data if len(r)>col)
print('total samples',tot)
for r in sorted([r for r in data if len(r)>col],key=lambda r:-num(r[col]))[:25]:
    print('%6.1f%%'%(100*num(r[col])/max(tot,1)), r[src][:90])
PY
  grep -E "^\s+(Duration|Elapsed Cycles|L2 Cache Throughput|Memory Throughput|Compute \(SM\) Throughput|Grid Size)" $OUT/x/$name-details.txt | head -6 | sed "s/^/$name /"
  head -8 $OUT/x/$name-stalls.txt | sed "s/^/$name /"
  rm -f $OUT/x/$name.ncu-rep
}
prof conv-64x64 conv2d 8,512,7,7,512,3,3,1,1 $E/l7-64x64-s8-f1.jsonl
prof mm-64x64 matmul 392,512,4608 $E/mm-l7-64x64-s8.jsonl
cp target/device-pack/exp2.sh $OUT/job.sh; cp -r $E $OUT/records
cd $OUT && tar -czf exp2.tgz * && find . -mindepth 1 -not -name exp2.tgz -exec rm -rf {} +
