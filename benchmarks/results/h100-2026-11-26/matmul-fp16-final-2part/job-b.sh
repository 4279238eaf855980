set -u
# Part B: the same log resumed (the warm machine's /tmp), then bench and deploy.
ls -la /tmp/mm.jsonl || exit 3
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
export LD_LIBRARY_PATH=$PWD/target/device/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$PWD/target/device/fonts/DejaVuSans.ttf
B=$PWD/target/device/tilesched
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
N=matmul-fp16-final-2part
mkdir -p $OUT/$N
start=$(date +%s)
$B tune matmul $S --dtype fp16 --out-dtype fp16 --time-budget ${BUDGET_B:-420} --objective geomean --trials 12000 --resume --log /tmp/mm.jsonl > $OUT/$N/tune.txt 2> $OUT/$N/tune-stderr.txt
echo "tune B exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune.txt
start=$(date +%s)
timeout 100 $B bench matmul $S --dtype fp16 --out-dtype fp16 --log /tmp/mm.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune.txt
gzip -9c /tmp/mm.jsonl > $OUT/$N-log.jsonl.gz
$B deploy add --log /tmp/mm.jsonl --cache /tmp/deploy-$N > $OUT/$N/deploy.txt 2>&1; tar -C /tmp -czf $OUT/deploy-$N.tgz deploy-$N
head -12 $OUT/$N/tune.txt; grep -E "^\| matmul|total|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,4-9 | head -14
cd $OUT && tar -cf $N.tar $N && rm -rf $N
