#!/bin/sh
# Run the headless loadgen Job, copy its results out and exit with loadgen's verdict:
# 0 pass, 1 request failures, 2 usage error, 3 an SLO was missed, 4 generator saturated;
# 124 when the run did not finish within TIMEOUT_S (nothing was judged).
#
#   k8s/overlays/ci-job/run-ci.sh
#   OUT=./results TIMEOUT_S=3600 CLEANUP=1 k8s/overlays/ci-job/run-ci.sh
#
# Needs kubectl with access to the cluster and the Secrets loadgen-target and loadgen-join in namespace loadgen.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
NS=loadgen  # the overlay's `namespace:`
OUT=${OUT:-./results}
TIMEOUT_S=${TIMEOUT_S:-3600}
CLEANUP=${CLEANUP:-0}

# A Job runs once: delete the previous run's Jobs so that apply starts a new one.
kubectl -n "$NS" delete job loadgen-master loadgen-worker --ignore-not-found --wait=true
kubectl apply -k "$here"

echo "waiting for job/loadgen-master (up to ${TIMEOUT_S}s)"
deadline=$(( $(date +%s) + TIMEOUT_S ))
while :; do
    conditions=$(kubectl -n "$NS" get job loadgen-master \
        -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type}{" "}{end}')
    case " $conditions " in
        *" Complete "*|*" Failed "*) break ;;
    esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "job/loadgen-master did not finish within ${TIMEOUT_S}s" >&2
        kubectl -n "$NS" describe job loadgen-master >&2 || true
        exit 124
    fi
    sleep 5
done

# The newest pod of the Job holds the verdict (a disrupted pod may have been replaced).
pod=$(kubectl -n "$NS" get pods -l job-name=loadgen-master \
    --sort-by=.metadata.creationTimestamp -o jsonpath='{.items[-1:].metadata.name}')
code=$(kubectl -n "$NS" get pod "$pod" \
    -o jsonpath='{.status.containerStatuses[?(@.name=="master")].state.terminated.exitCode}')
kubectl -n "$NS" logs "$pod" -c master --tail=100 || true

kubectl -n "$NS" apply -f "$here/collect/results-reader.yaml"
kubectl -n "$NS" wait --for=condition=Ready pod/loadgen-results-reader --timeout=300s
kubectl -n "$NS" cp loadgen-results-reader:/results "$OUT"
kubectl -n "$NS" delete pod loadgen-results-reader --wait=false
echo "results copied to $OUT"

if [ "$CLEANUP" = 1 ]; then
    # The run's objects and its volume (copied above); the namespace and its Secret stay.
    kubectl -n "$NS" delete job loadgen-master loadgen-worker --ignore-not-found --wait=false
    kubectl -n "$NS" delete pvc loadgen-results --ignore-not-found --wait=false
fi

echo "loadgen exit code: ${code:-unknown}"
# No exit code means the container never ran (image pull, missing Secret): not a pass.
exit "${code:-125}"
