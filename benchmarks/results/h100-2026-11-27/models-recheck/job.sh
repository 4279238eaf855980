set -u
# Issue 27's model lines re-checked on this build: ResNeXt-50 32x4d, ConvNeXt-T and
# ViT-B/16 (fp16 NHWC) and EfficientNet-B0 (f32), exported afresh, benched from the best
# records committed on 2026-11-25 (no tuning); EfficientNet-B0's conv2d bench timed end to end.
. target/device-pack/common0.sh
R=benchmarks/results/h100-2026-11-25
W=$(mktemp -d)
python3 benchmarks/onnx/export.py $W/onnx --models resnext50_32x4d convnext_tiny vit_b_16 efficientnet_b0 > $OUT/onnx-export.txt 2>&1; echo "export exit $?"
for spec in resnext50_32x4d:onnx-resnext50-fp16:fp16 convnext_tiny:onnx-convnext-tiny-fp16:fp16 vit_b_16:onnx-vit-b16-fp16:fp16 efficientnet_b0:onnx-efficientnet-b0-f32:f32; do
  IFS=: read model dir dt <<< "$spec"
  T=""; [ $dt = fp16 ] && T="--dtype fp16 --out-dtype fp16 --layout nhwc"
  for op in conv2d matmul; do
    [ -f $R/$dir/$op-best-records.jsonl.gz ] || continue
    # The records are `best --json` output (one JSON array): a log holds one per line.
    zcat $R/$dir/$op-best-records.jsonl.gz | python3 -c "import json,sys; [print(json.dumps(r)) for r in json.load(sys.stdin)]" > $W/$model-$op.jsonl
    echo "$dir $op: $(wc -l < $W/$model-$op.jsonl) records"
    o=$OUT/$dir/$op; mkdir -p $o; start=$(date +%s)
    timeout 200 $B bench $op --onnx $W/onnx/$model.onnx $T --log $W/$model-$op.jsonl --out $o > $o/bench-stdout.txt 2> $o/bench-stderr.txt
    echo "$dir $op bench exit $?, wall $(( $(date +%s) - start )) s" | tee $o/bench-wall.txt
    rm -f $o/*.png
  done
done
cp target/device-pack/models.sh $OUT/job.sh
cd $OUT && tar -czf models.tgz * && find . -mindepth 1 -not -name models.tgz -exec rm -rf {} +
