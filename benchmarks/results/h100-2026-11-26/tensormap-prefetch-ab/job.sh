set -u
# Issue 30: (1) clusters whose grid fits the GPU's co-resident clusters, unsplit, on the
# two b8 layers that lose (7² and 14² 3×3), one state each, timed by bench; (2) A/B of
# prefetch.tensormap (f6db208) against the previous build (318dd0d) on the b1 470 s log.
. target/device-pack/common0.sh
E=target/device-pack/exp1
T="--dtype fp16 --out-dtype fp16 --layout nhwc"
V="--algorithms 1 --engines 1 --handles 0 --conv-gemm-algorithms 0"
mkdir -p $OUT/clusters $OUT/prefetch /tmp/old
for f in $E/*.jsonl; do
  n=$(basename $f .jsonl)
  case $n in l7*) S=8,512,7,7,512,3,3,1,1;; *) S=8,256,14,14,256,3,3,1,1;; esac
  timeout 60 $B bench conv2d --shape $S $T --log $f --out /tmp/b-$n --rounds 2 --min-time-ms 20 $V > $OUT/clusters/$n-bench.txt 2>&1
  echo "$n: $(grep -E 'ours .*vendor' $OUT/clusters/$n-bench.txt | cut -d: -f2-)"
done
tar -C /tmp/old -xJf target/device-pack/device-old.tar.xz
L=target/device-pack/b1-470s.jsonl.gz
for i in 1 2; do
  for v in old new; do
    if [ $v = old ]; then BB="env LD_LIBRARY_PATH=/tmp/old/device/lib:$LD_LIBRARY_PATH /tmp/old/device/tilesched"; else BB=$B; fi
    timeout 120 $BB bench conv2d --network resnet --batch 1 $T --log $L --out $OUT/prefetch/$v-$i $V > $OUT/prefetch/$v-$i.txt 2>&1
    echo "$v-$i exit $?: $(grep -E 'Geometric' $OUT/prefetch/$v-$i/bench.md | cut -c1-60)"
  done
done
python3 - $OUT/prefetch <<'PY'
import json,sys,os
d=sys.argv[1]; runs={}
for v in ['old-1','new-1','old-2','new-2']:
    try: runs[v]={r['task']:r for r in json.load(open(f'{d}/{v}/bench.json'))['rows']}
    except Exception as e: print(v,'unreadable',e)
print('task sketch old-1 new-1 old-2 new-2 (ours, µs)')
for t,r in runs.get('new-1',{}).items():
    print(t[:44], r['sketch'], ' '.join('%.2f'%runs[v][t]['ours']['median_us'] if t in runs.get(v,{}) else '-' for v in ['old-1','new-1','old-2','new-2']))
PY
cp target/device-pack/exp1.sh $OUT/job.sh; cp -r $E $OUT/records
cd $OUT && tar -czf exp1.tgz * && find . -mindepth 1 -not -name exp1.tgz -exec rm -rf {} +
