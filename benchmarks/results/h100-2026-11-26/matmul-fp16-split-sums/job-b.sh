set -u
# Call 3: the whole fp16 set benched from call 2's log (the warm machine's /tmp), the
# deploy cache, then the PyTorch peer on it.
ls -la /tmp/mm.jsonl || exit 3
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
export LD_LIBRARY_PATH=$PWD/target/device/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$PWD/target/device/fonts/DejaVuSans.ttf
B=$PWD/target/device/tilesched
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
N=matmul-fp16-split-sums
mkdir -p $OUT/$N
start=$(date +%s)
timeout 120 $B bench matmul $S --dtype fp16 --out-dtype fp16 --log /tmp/mm.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/bench-wall.txt
grep -E "^\| matmul|total|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,4-9 | head -14
python3 benchmarks/scripts/trim_log.py /tmp/mm.jsonl $OUT/$N-log.jsonl.gz > /dev/null; ls -la $OUT/$N-log.jsonl.gz
$B deploy add --log /tmp/mm.jsonl --cache /tmp/deploy-$N > $OUT/$N/deploy.txt 2>&1
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" | tee $OUT/torch.txt
for t in ${TASKS:-}; do
  start=$(date +%s)
  timeout ${TT:-60} python3 benchmarks/peer/torch_peer.py --deploy /tmp/deploy-$N --out $OUT/peer-$t --tasks "$t" --compile-timeout ${CT:-45} --min-time-ms 50 --rounds 2 > $OUT/peer-$t.txt 2>&1
  echo "$t: peer exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/peer-$t.txt
  grep -E "^\| \`" $OUT/peer-$t/peer.md 2>/dev/null | head -3
done
cd $OUT && tar -czf call3.tgz * && find . -mindepth 1 -not -name call3.tgz -exec rm -rf {} +
