#!/usr/bin/env bash
# Repeats CI's references run; on a run past LIMIT seconds, dumps the process tree and stacks.
cd "${REPO:-/tmp/ci3/repo}"
LIMIT=${LIMIT:-420}
for i in $(seq 1 ${N:-20}); do
  start=$(date +%s)
  .build/release/ipcbench run --quick --transport unix-socket --framing binary --sizes 64,4096 --skip-scale \
    --skip-in-process --skip-global-executor --references Benchmarks/References/.build/bin --no-progress --output ${OUT:-/tmp/hang}/out-$i > ${OUT:-/tmp/hang}/run-$i.log 2>&1 &
  pid=$!
  while kill -0 $pid 2>/dev/null && [ $(( $(date +%s) - start )) -lt $LIMIT ]; do sleep 2; done
  if kill -0 $pid 2>/dev/null; then
    echo "run $i HUNG at $(date)" >> ${OUT:-/tmp/hang}/summary
    ps -eo pid,ppid,stat,wchan:30,etime,args --forest > ${OUT:-/tmp/hang}/hang-$i-ps.txt
    for p in $(pgrep -f 'ipcbench|ref-|iox-roudi|dbus-daemon|floor'); do
      echo "== $p $(tr '\0' ' ' < /proc/$p/cmdline)"; cat /proc/$p/stack 2>/dev/null | head -5
      gdb -p $p -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E '^#|^Thread' | head -80
    done > ${OUT:-/tmp/hang}/hang-$i-stacks.txt 2>&1
    kill -9 $pid; pkill -9 -f 'ref-|iox-roudi'; sleep 2
  else
    wait $pid; echo "run $i exit $? in $(( $(date +%s) - start )) s at $(date +%T)" >> ${OUT:-/tmp/hang}/summary
  fi
done
