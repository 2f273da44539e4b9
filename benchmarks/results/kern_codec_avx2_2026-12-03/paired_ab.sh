for round in 1 2 3; do for w in 32_0.30 32_0.55 128_0.30 128_0.55; do set -- ${w/_/ }
  echo "old $w $(PYTHONPATH=/tmp/kern/pkgA /work/wt-kern/.venv/bin/python /tmp/kern/prof2.py $1 $2 11)"
  echo "new $w $(/work/wt-kern/.venv/bin/python /tmp/kern/prof2.py $1 $2 11)"
done; done
