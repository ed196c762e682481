#!/bin/bash
# The reward: 1 when /app/answer.txt holds the sum of /app/numbers.txt, else 0.
expected=$(awk '{ s += $1 } END { print s }' /app/numbers.txt)
if [ "$(cat /app/answer.txt 2>/dev/null)" = "$expected" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo "expected $expected, got: $(cat /app/answer.txt 2>&1)"
    echo 0 > /logs/verifier/reward.txt
fi
