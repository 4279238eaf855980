set -u
# Issue 30: Nsight Compute on the best b8 wgmma conv kernels that lose, on two
# alternatives of the 7x7 layer, and on cuDNN's kernel for it.
. target/device-pack/common0.sh
P=target/device-pack/prof
T="--dtype fp16 --out-dtype fp16 --layout nhwc"
mkdir -p $OUT/prof
prof() { # name log shape kernel-regex [bench opts]
  local name=$1 log=$2 shape=$3 re=$4; shift 4
  timeout 150 ncu --clock-control none --kernel-name-base function --kernel-name "regex:$re" --launch-skip 2 --launch-count 1 \
    --set full --import-source no -o $OUT/prof/$name -f \
    $B bench conv2d --shape $shape $T --log $log --out /tmp/pb-$name --rounds 1 --min-time-ms 1 --min-repeats 3 --algorithms 1 --engines 1 --handles 0 --conv-gemm-algorithms 0 \
    > $OUT/prof/$name-run.txt 2>&1
  echo "$name exit $?"; grep -E "ours .*vendor" $OUT/prof/$name-run.txt | head -2
  ncu -i $OUT/prof/$name.ncu-rep --page details --print-details all > $OUT/prof/$name-details.txt 2>&1
  ncu -i $OUT/prof/$name.ncu-rep --page source --csv --print-source sass > /tmp/src-$name.csv 2>/dev/null
  python3 - /tmp/src-$name.csv > $OUT/prof/$name-stalls.txt <<'PY'
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
print('total samples',tot,'columns',hd)
for r in sorted([r for r in data if len(r)>col],key=lambda r:-num(r[col]))[:40]:
    print('%6.1f%%'%(100*num(r[col])/max(tot,1)), r[0], r[src], '|', ' '.join(r[j] for j in range(len(r)) if j not in (col,src,0))[:300])
PY
}
prof l7 $P/best-l7.jsonl 8,512,7,7,512,3,3,1,1 '^conv2d_'
prof l7-128x112s4 $P/alt-l7-128x112s4.jsonl 8,512,7,7,512,3,3,1,1 '^conv2d_'
prof l7-64x32s1 $P/alt-l7-64x32s1.jsonl 8,512,7,7,512,3,3,1,1 '^conv2d_'
prof l7-cudnn $P/best-l7.jsonl 8,512,7,7,512,3,3,1,1 '^(?!conv2d_|tilesched|reference)'
prof l14 $P/best-l14.jsonl 8,256,14,14,256,3,3,1,1 '^conv2d_'
prof l7b $P/best-l7b.jsonl 8,512,7,7,2048,1,1,1,0 '^conv2d_'
prof l56 $P/best-l56.jsonl 8,64,56,56,64,3,3,1,1 '^conv2d_'
prof stem $P/best-stem.jsonl 8,3,224,224,64,7,7,2,3 '^conv2d_'
#prof stem-cudnn $P/best-stem.jsonl 8,3,224,224,64,7,7,2,3 '^(?!conv2d_|tilesched|reference)'
cd $OUT && tar -czf prof.tgz prof && rm -rf prof
