set -u
# The PyTorch peer on the resnet fp16 batch-BATCH kernels (the committed trimmed log):
# a deploy cache, then our kernels beside eager and torch.compile, warm and cold L2.
mkdir -p target && [ -x target/device/tilesched ] || tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
B=$D/tilesched
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
L=benchmarks/results/h100-2026-11-26/$LOG/tune-log.jsonl.gz
N=peer-resnet-fp16-b$BATCH-hopper
mkdir -p $OUT/$N
$B deploy add --log $L --cache /tmp/deploy-$BATCH > $OUT/$N/deploy.txt 2>&1; echo "deploy exit $?"
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" | tee $OUT/$N/torch.txt
start=$(date +%s)
timeout ${TT:-400} python3 benchmarks/peer/torch_peer.py --deploy /tmp/deploy-$BATCH --out $OUT/$N --compile-timeout ${CT:-40} --min-time-ms 50 --rounds 2 > $OUT/$N/peer-stdout.txt 2>&1
echo "peer exit $?, wall $(( $(date +%s) - start )) s"
grep -E "^\| |geometric|Geometric" $OUT/$N/peer.md 2>/dev/null | head -24; tail -5 $OUT/$N/peer-stdout.txt
cp target/device-pack/peer.sh $OUT/$N/job.sh
cd $OUT && tar -czf peer.tgz * && find . -mindepth 1 -not -name peer.tgz -exec rm -rf {} +
