#!/bin/sh
# Deploys the site once dns and storage exist; their results arrive in the lease's "inputs".
lease=$(cat)
case "$lease" in
  *'"provision-dns"'*'"provision-storage"'* | *'"provision-storage"'*'"provision-dns"'*) ;;
  *) echo "deploy: missing inputs from dns and storage" >&2; exit 3 ;;
esac
echo "deploy: deploying site" >&2
sleep "${EXAMPLE_STEP_SECONDS:-1}"
echo '{"url": "https://acme.example.com", "status": "live"}'
