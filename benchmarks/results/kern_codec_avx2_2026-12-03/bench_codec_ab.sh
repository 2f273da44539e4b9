#!/bin/bash
# bench codec of the base (c233f32: /tmp/kern/pkgA, its release build) and of kern (the
# worktree's release build), alternating, same interpreter and command.
set -u
OUT=/tmp/kern/ab
CMD="-m hvd_lossy.bench codec --workloads realistic --dims 32 128 --distinct 0.30 0.55 --levels 1"
for round in 1 2; do
  for side in old new; do
    uptime > $OUT/${side}_$round.console.txt
    if [ $side = old ]; then
      (cd /tmp/kern/srcA && PYTHONPATH=/tmp/kern/pkgA /work/wt-kern/.venv/bin/python $CMD --json $OUT/${side}_$round.json >> $OUT/${side}_$round.console.txt 2>&1)
    else
      (cd /work/wt-kern && .venv/bin/python $CMD --json $OUT/${side}_$round.json >> $OUT/${side}_$round.console.txt 2>&1)
    fi
  done
done
echo done > $OUT/DONE
