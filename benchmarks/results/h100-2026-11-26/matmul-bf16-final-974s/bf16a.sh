set -u
# Part A of a fresh bf16 tune of the set on this build (empty log, /tmp of the warm machine).
. target/device-pack/common.sh
rm -f /tmp/mm.jsonl
start=$(date +%s)
$B tune matmul $S --dtype bf16 --out-dtype bf16 --time-budget ${BUDGET_A:-530} --objective geomean --trials 12000 --log /tmp/mm.jsonl > $OUT/$N/tune-a.txt 2> $OUT/$N/tune-a-stderr.txt
echo "tune A exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-a.txt
head -12 $OUT/$N/tune-a.txt
python3 benchmarks/scripts/trim_log.py /tmp/mm.jsonl $OUT/bf16-a.jsonl.gz > /dev/null
cp target/device-pack/common.sh target/device-pack/bf16a.sh $OUT/$N/
