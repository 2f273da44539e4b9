#!/bin/bash
# Step time A/B of short blocks (benchmarks/RESULTS.md): before=/work/wt-pre (5250396), after=/work/main,
# the trees taking turns, which goes first alternating; ROUNDS rounds (default 4); the main job's 1 Gbit/s
# setting (adaptive level 1) and criteo-d128 lossy at 10 Gbit/s. Needs root, ip and tc.
set -u
NS=hvdl-abs
ip netns add $NS; ip -n $NS link set lo up
trap "ip netns del $NS" EXIT
run() { # tree rate label flags...
  local tree=$1 rate=$2 label=$3; shift 3
  ip netns exec $NS tc qdisc replace dev lo root tbf rate ${rate}gbit burst 512kb latency 100ms
  cd $tree && ip netns exec $NS env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$tree OMP_NUM_THREADS=1 \
    mpirun -np 2 --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x PYTHONPATH -x OMP_NUM_THREADS \
    /work/main/.venv/bin/python examples/dlrm/train.py "$@" --no-progress --eval-points 0 --seed 0 --metrics-out ${TMPDIR:-/tmp}/short_step_ab.json > ${TMPDIR:-/tmp}/short_step_ab.log 2>&1 || { echo FAIL; tail -3 ${TMPDIR:-/tmp}/short_step_ab.log; }
  python3 -c "import json; m=json.load(open('${TMPDIR:-/tmp}/short_step_ab.json')); print('$label', '$(basename $tree)', round(1e3*m['iter_seconds_median'],1), round(m['compression_ratio'],2), m['auc'])"
}
MAINJOB="--data data/criteo_kaggle_sample --embedding-dim 128 --batch-size 1024 --epochs 3 --compression adaptive --error-bound 0.03 --backward-error-bound 0.02 --dither backward --level 1"
D128="--synthetic 100000 --synthetic-test 10000 --embedding-dim 128 --batch-size 1024 --steps 40"
for round in $(seq 1 ${ROUNDS:-4}); do
  if [ $((round % 2)) = 1 ]; then order="/work/wt-pre /work/main"; else order="/work/main /work/wt-pre"; fi
  echo "round $round load $(cut -d' ' -f1 /proc/loadavg)"
  for tree in $order; do run $tree 1 mainjob-1G $MAINJOB; done
  for tree in $order; do run $tree 10 d128-lossy-10G $D128 --compression lossy --error-bound 0.03; done
done
