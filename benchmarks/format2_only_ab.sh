#!/bin/bash
# Usage: OUT=dir bash benchmarks/format2_only_ab.sh (base tree built in /tmp/base at d4eb0f9, new in /work/main)
for r in 1 2 3 4 5 6; do
  for simd in avx512 avx2; do
    env=""; [ $simd = avx2 ] && env="HVD_LOSSY_NO_AVX512=1"
    for t in base new; do
      d=/tmp/base; [ $t = new ] && d=/work/main
      (cd $d && env $env PYTHONPATH=$d taskset -c 1 .venv/bin/python benchmarks/format2_only_ab.py $t $OUT/ab2_${t}_${simd}_$r.json > /dev/null 2>&1)
    done
  done
done
