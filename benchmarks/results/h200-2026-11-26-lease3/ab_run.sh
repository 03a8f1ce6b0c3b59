export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
A=(--device cuda --batch 64 --context 32768 --variants decode-kernel)
for i in 1 2; do
  echo "old $i"; (cd .ab_old && PYTHONPATH=/tmp/site:$PWD timeout 40 python3 benchmarks/attention_decode.py "${A[@]}" --specs "KV4 g32" "KV8 g64" "KV4 g32 sym" --output $OUT/old$i.json 2>&1 | grep "^| 64" | sort -u)
  echo "new $i"; timeout 40 python3 benchmarks/attention_decode.py "${A[@]}" --specs "KV4 g32" "KV8 g64" "KV4 g32 sym" --output $OUT/new$i.json 2>&1 | grep "^| 64" | sort -u
done
echo "4-warp narrow"; timeout 50 python3 benchmarks/attention_decode.py "${A[@]}" --specs "KV4 g128" "KV3 g32" --block-tokens 64 32 --num-warps 4 2 --num-stages 2 --output $OUT/narrow.json 2>&1 | grep "^| 64" | sort -u
