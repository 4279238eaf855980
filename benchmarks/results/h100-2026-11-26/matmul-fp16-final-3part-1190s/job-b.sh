set -u
# Call 5: part B of the fresh tune (the warm machine's /tmp log, resumed), then bench.
ls -la /tmp/mm.jsonl || exit 3
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$D/fonts/DejaVuSans.ttf
B=$D/tilesched
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
N=matmul-fp16-final
mkdir -p $OUT/$N
start=$(date +%s)
$B tune matmul $S --dtype fp16 --out-dtype fp16 --time-budget ${BUDGET_B:-500} --objective geomean --trials 12000 --resume --log /tmp/mm.jsonl > $OUT/$N/tune-b.txt 2> $OUT/$N/tune-b-stderr.txt
echo "tune B exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-b.txt
head -12 $OUT/$N/tune-b.txt
start=$(date +%s)
timeout 60 $B bench matmul $S --dtype fp16 --out-dtype fp16 --log /tmp/mm.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-b.txt
grep -E "^\| matmul|total|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,4-9 | head -14
python3 benchmarks/scripts/trim_log.py /tmp/mm.jsonl $OUT/$N-log.jsonl.gz > /dev/null
cd $OUT && tar -czf call5.tgz * && find . -mindepth 1 -not -name call5.tgz -exec rm -rf {} +
