#!/bin/bash
# brk.sh dim share what iters  -> ms per call by symbol (cpu-clock 4 kHz)
PY=${PY:-/work/wt-kern/.venv/bin/python}
perf record -e cpu-clock -F 4000 -o /tmp/kern/b.data $PY /tmp/kern/prof.py $1 $2 $3 $4 2>&1 | grep -v "^\[ perf"
perf report -i /tmp/kern/b.data -n --no-children --sort symbol --stdio 2>/dev/null | grep -v "^#" | grep "%" | grep -v "python3.11\|ld-linux\|openblas\|libtorch\|multiarray\|libgomp" | head -${5:-22} | awk -v it=$4 '{s=""; for(i=4;i<=NF;i++) s=s" "$i; printf "%7.2f ms %s\n", $2/4000/it*1000, s}'
