set -u
# Part B: the same log resumed (the warm machine's /tmp, else part A's trimmed copy), then bench.
. target/device-pack/common.sh
[ -s /tmp/mm.jsonl ] || { echo "no /tmp log: part A's trimmed copy"; gunzip -c target/device-pack/bf16-a.jsonl.gz > /tmp/mm.jsonl; }
start=$(date +%s)
$B tune matmul $S --dtype bf16 --out-dtype bf16 --time-budget ${BUDGET_B:-470} --objective geomean --trials 12000 --resume --log /tmp/mm.jsonl > $OUT/$N/tune-b.txt 2> $OUT/$N/tune-b-stderr.txt
echo "tune B exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-b.txt
head -12 $OUT/$N/tune-b.txt
start=$(date +%s)
timeout 70 $B bench matmul $S --dtype bf16 --out-dtype bf16 --log /tmp/mm.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-b.txt
grep -E "^\| matmul|total|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,4-9 | head -14
python3 benchmarks/scripts/trim_log.py /tmp/mm.jsonl $OUT/$N/tune-log.jsonl.gz > /dev/null
cp target/device-pack/bf16b.sh $OUT/$N/
cd $OUT && tar -czf bf16b.tgz * && find . -mindepth 1 -not -name bf16b.tgz -exec rm -rf {} +
