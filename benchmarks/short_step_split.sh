#!/bin/bash
# Short blocks (benchmarks/RESULTS.md): one main-job 1 Gbit/s and one criteo-d128 10 Gbit/s run per tree
# (before=/work/wt-pre, after=/work/main), two rounds, and the example's time_split medians. Needs root, ip and tc.
set -u
NS=hvdl-abt
ip netns add $NS; ip -n $NS link set lo up
trap "ip netns del $NS" EXIT
MAINJOB="--data data/criteo_kaggle_sample --embedding-dim 128 --batch-size 1024 --epochs 3 --compression adaptive --error-bound 0.03 --backward-error-bound 0.02 --dither backward --level 1"
D128="--synthetic 100000 --synthetic-test 10000 --embedding-dim 128 --batch-size 1024 --steps 40 --compression lossy --error-bound 0.03"
for round in 1 2; do
for setting in mainjob d128; do
  if [ $setting = mainjob ]; then rate=1; flags=$MAINJOB; else rate=10; flags=$D128; fi
  ip netns exec $NS tc qdisc replace dev lo root tbf rate ${rate}gbit burst 512kb latency 100ms
  for tree in /work/wt-pre /work/main; do
    cd $tree && ip netns exec $NS env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$tree OMP_NUM_THREADS=1 \
      mpirun -np 2 --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x PYTHONPATH -x OMP_NUM_THREADS \
      /work/main/.venv/bin/python examples/dlrm/train.py $flags --no-progress --eval-points 0 --seed 0 --metrics-out ${TMPDIR:-/tmp}/short_step_split.json > ${TMPDIR:-/tmp}/short_step_split.log 2>&1 || echo FAIL
    python3 -c "
import json, statistics as st
m=json.load(open('${TMPDIR:-/tmp}/short_step_split.json')); ts=m['time_split'][5:]
f=lambda k: round(1e3*st.median(t[k] for t in ts),2)
print('$setting', '$(basename $tree)', 'step', round(1e3*m['iter_seconds_median'],1), 'compress', f('compress_s'), 'decompress', f('decompress_s'), 'comm', f('comm_s'), 'compute', f('compute_s'))"
  done
done
done
