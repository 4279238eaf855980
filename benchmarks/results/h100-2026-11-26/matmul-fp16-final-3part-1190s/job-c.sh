set -u
# Call 6: 128x768x3072 tuned BUDGET_C s more on the fresh log (resumed; the set's
# tuning stays within 20 minutes), the set benched, the deploy cache, the PyTorch peer.
ls -la /tmp/mm.jsonl || exit 3
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$D/fonts/DejaVuSans.ttf
B=$D/tilesched
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
N=matmul-fp16-final
mkdir -p $OUT/$N
start=$(date +%s)
$B tune matmul --shape 128,768,3072 --dtype fp16 --out-dtype fp16 --time-budget ${BUDGET_C:-190} --objective geomean --trials 30000 --resume --log /tmp/mm.jsonl > $OUT/$N/tune-c.txt 2> $OUT/$N/tune-c-stderr.txt
echo "tune C exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-c.txt
head -4 $OUT/$N/tune-c.txt
start=$(date +%s)
timeout 60 $B bench matmul $S --dtype fp16 --out-dtype fp16 --log /tmp/mm.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-c.txt
grep -E "^\| matmul|total|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,4-9 | head -14
python3 benchmarks/scripts/trim_log.py /tmp/mm.jsonl $OUT/$N-log.jsonl.gz > /dev/null
$B deploy add --log /tmp/mm.jsonl --cache /tmp/deploy-$N > $OUT/$N/deploy.txt 2>&1
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" | tee $OUT/torch.txt
for t in ${TASKS:-}; do
  timeout ${TT:-60} python3 benchmarks/peer/torch_peer.py --deploy /tmp/deploy-$N --out $OUT/peer-$t --tasks "$t" --compile-timeout ${CT:-45} --min-time-ms 50 --rounds 2 > $OUT/peer-$t.txt 2>&1
  grep -E "^\| \`" $OUT/peer-$t/peer.md 2>/dev/null | head -3
done
cd $OUT && tar -czf call6.tgz * && find . -mindepth 1 -not -name call6.tgz -exec rm -rf {} +
