#!/bin/bash
set -euo pipefail
awk '{ s += $1 } END { print s }' /app/numbers.txt > /app/answer.txt
echo "wrote $(cat /app/answer.txt)"
