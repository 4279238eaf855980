set -u
# Issue 27's agreement line on the fp16 matmul set: the committed 1190 s log of 2026-11-26
# (matmul-fp16-final-3part-1190s) benched, then the PyTorch peer on the same kernels in one
# invocation (cuBLAS's choice does not vary between threads: one eager pick per matmul).
. target/device-pack/common0.sh
L=benchmarks/results/h100-2026-11-26/matmul-fp16-final-3part-1190s/tune-log.jsonl.gz
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
N=matmul-fp16-final-rebench
mkdir -p $OUT/$N
zcat $L > /tmp/mm.jsonl
timeout 120 $B bench matmul $S --dtype fp16 --out-dtype fp16 --log /tmp/mm.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?: $(grep Geometric $OUT/$N/bench.md | cut -c1-60)"
$B deploy add --log /tmp/mm.jsonl --cache /tmp/deploy-mm > $OUT/$N/deploy.txt 2>&1; echo "deploy exit $?"
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" > $OUT/torch.txt
P=$OUT/peer-matmul-fp16; mkdir -p $P; start=$(date +%s)
timeout 420 python3 benchmarks/peer/torch_peer.py --deploy /tmp/deploy-mm --out $P --compile-timeout 45 --min-time-ms 50 --rounds 2 > $P/peer-stdout.txt 2>&1
echo "peer exit $?, wall $(( $(date +%s) - start )) s"; grep -E "geomean" $P/peer.md
cp target/device-pack/matmul.sh $OUT/$N/job.sh
cd $OUT && tar -czf matmul.tgz * && find . -mindepth 1 -not -name matmul.tgz -exec rm -rf {} +
