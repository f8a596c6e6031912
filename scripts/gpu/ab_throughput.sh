#!/usr/bin/env bash
# One device command: Lab 1's grading throughput with this tree (B) and with the tree before a change (A), alternated
# on one host: one worker (8 submissions) then eight (64), A before B each time, --cell-times kept. Hosts of one kind
# differ too much for runs of two device commands to be compared (README, large classes).
# Prepare here: write the changed files as they were before the change under ab/base/ (untracked files travel with
# the tree), e.g. `mkdir -p ab/base/course && git show HEAD~1:course/fork_server.py > ab/base/course/fork_server.py`.
# Device command: bash scripts/gpu/ab_throughput.sh   (carry: [".whl", ".bwrap"]); results in $OUT/x.tar.gz.
set -u
[ -d ab/base ] || { echo "ab/base/ holds no files of the tree before the change" >&2; exit 2; }
bash scripts/gpu/run_reports.sh none > /tmp/install.log 2>&1; tail -2 /tmp/install.log
export PATH="$PWD/.bwrap:$PATH" EFFICIENT_AI_SANDBOX=on MPLBACKEND=Agg PYTHONUNBUFFERED=1
rm -rf /tmp/base && cp -r "$PWD" /tmp/base && cp -r ab/base/. /tmp/base/
mkdir -p /tmp/r
run() {  # tree tag args...
  local tree=$1 tag=$2; shift 2
  (cd "$tree" && PYTHONPATH="$tree" timeout 250 python3 scripts/bench_grading_throughput.py --lab lab1 --cell-times --out /tmp/r --tag "$tag" "$@" > "/tmp/r/$tag.log" 2>&1; echo "$tag $?")
}
run "$PWD" warm --submissions 1 --workers 1
began=$(date +%s)
for spec in "1 8" "8 64"; do
  set -- $spec
  run /tmp/base "A-$1w" --submissions "$2" --workers "$1"
  run "$PWD" "B-$1w" --submissions "$2" --workers "$1"
done
if [ $(( $(date +%s) - began )) -lt 300 ]; then
  run "$PWD" "B-8w2" --submissions 64 --workers 8
  run /tmp/base "A-8w2" --submissions 64 --workers 8
fi
grep -h "^| [0-9]" /tmp/r/grading-throughput-[AB]-*.md | cut -c1-140
tar czf "$OUT/x.tar.gz" -C /tmp/r .
