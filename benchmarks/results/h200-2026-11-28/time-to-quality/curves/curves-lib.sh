# Shared by the curves-*.sh jobs: the task sets and one tune / one bench of a variant.
R8="--network resnet --dtype fp16 --out-dtype fp16 --layout nhwc --batch 8"
DN="--onnx /tmp/onnx/densenet121.onnx --dtype fp16 --out-dtype fp16 --layout nhwc"
flags() { case $1 in cold) echo "--no-transfer --cold-model";; transfer) echo "--cold-model";; both) echo "";; esac; }
# tunev GPU NAME OP "TASKS" BUDGET VARIANT: a fresh log /tmp/res/NAME-VARIANT.jsonl
tunev() { local gpu=$1 name=$2 op=$3 tasks=$4 budget=$5 v=$6; local dir=/tmp/res/$name/$v; mkdir -p $dir; local s=$(date +%s)
  CUDA_VISIBLE_DEVICES=$gpu $TILESCHED_BIN tune $op $tasks --time-budget $budget --trials 1000000 --log /tmp/res/$name-$v.jsonl \
    --cubin-cache $(mktemp -d) $(flags $v) > $dir/tune.txt 2> $dir/tune-stderr.txt
  echo "tune exit $?, wall $(( $(date +%s) - s )) s" >> $dir/tune.txt; }
# benchv GPU NAME OP "TASKS" VARIANT (the log gzipped or not)
benchv() { local gpu=$1 name=$2 op=$3 tasks=$4 v=$5; local dir=/tmp/res/$name/$v; local s=$(date +%s)
  local log=/tmp/res/$name-$v.jsonl; [ -f $log ] || log=$log.gz
  CUDA_VISIBLE_DEVICES=$gpu $TILESCHED_BIN bench $op $tasks --log $log --out $dir/bench > $dir/bench-stdout.txt 2> $dir/bench-stderr.txt
  echo "bench exit $?, wall $(( $(date +%s) - s )) s" >> $dir/tune.txt; }
