set -u
# Part A: the no-regression re-bench, then the fp16 set's first 330 s of tuning.
bash target/device-pack/rebench.sh 2>&1 | tail -8
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
export LD_LIBRARY_PATH=$PWD/target/device/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$PWD/target/device/fonts/DejaVuSans.ttf
B=$PWD/target/device/tilesched
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
N=matmul-fp16-final-2part
mkdir -p $OUT/$N
rm -f /tmp/mm.jsonl; start=$(date +%s)
$B tune matmul $S --dtype fp16 --out-dtype fp16 --time-budget ${BUDGET_A:-330} --objective geomean --trials 12000 --log /tmp/mm.jsonl > $OUT/$N/tune-a.txt 2> $OUT/$N/tune-a-stderr.txt
echo "tune A exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-a.txt
head -11 $OUT/$N/tune-a.txt
gzip -9c /tmp/mm.jsonl > $OUT/$N-log-a.jsonl.gz
