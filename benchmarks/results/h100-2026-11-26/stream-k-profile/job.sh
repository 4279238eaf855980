set -u
# Issue 30: where stream-K's time goes: Nsight Compute on two stream-K states and the
# unstreamed twin of one.
. target/device-pack/common0.sh
E=target/device-pack/exp4
T="--dtype fp16 --out-dtype fp16 --layout nhwc"
V="--algorithms 1 --engines 1 --handles 0 --conv-gemm-algorithms 0"
mkdir -p $OUT/x
prof() { # name shape log
  local name=$1 shape=$2 log=$3
  timeout 150 ncu --clock-control none --kernel-name-base function --kernel-name "regex:^conv2d_" --launch-skip 2 --launch-count 1 \
    --set full --import-source no -o $OUT/x/$name -f \
    $B bench conv2d --shape $shape $T $V --log $log --out /tmp/pb-$name --rounds 1 --min-time-ms 1 --min-repeats 3 > $OUT/x/$name-ncu-run.txt 2>&1
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
adr=[j for j,c in enumerate(hd) if c=='Address'][0]
def num(x):
    try: return float(x.replace(',',''))
    except: return 0
tot=sum(num(r[col]) for r in data if len(r)>col)
print('total samples',tot)
for r in sorted([r for r in data if len(r)>col],key=lambda r:-num(r[col]))[:30]:
    print('%6.1f%%'%(100*num(r[col])/max(tot,1)), r[adr][-5:], r[src][:90])
PY
  grep -E "^\s+(Duration|Elapsed Cycles|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Grid Size)" $OUT/x/$name-details.txt | head -6 | sed "s/^/$name /"
  head -12 $OUT/x/$name-stalls.txt | sed "s/^/$name /"
  rm -f $OUT/x/$name.ncu-rep
}
prof sk-1x1 8,512,7,7,2048,1,1,1,0 $E/l1x1b8-64x32-s8-sk132.jsonl
prof flat-1x1 8,512,7,7,2048,1,1,1,0 $E/l1x1b8-64x32-s8-flat.jsonl
prof sk-l7 8,512,7,7,512,3,3,1,1 $E/l7b8-64x64-s8-sk132.jsonl
cp target/device-pack/exp4.sh $OUT/job.sh; cp -r $E $OUT/records
cd $OUT && tar -czf exp4.tgz * && find . -mindepth 1 -not -name exp4.tgz -exec rm -rf {} +
