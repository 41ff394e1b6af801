#!/usr/bin/env bash
# A freeze fine-tune of a GGUF base writes an HF folder (`lathe train`, finetuning_type freeze / full) with tokenizer
# files made from the GGUF's byte-level vocabulary (tokenizer::HfTokenizerFilesFromGguf). HF's own `tokenizers`
# (pinned, from PyPI into a cached venv) reads that tokenizer.json and gives the ids `lathe tokenize` gives for the
# GGUF, on SmolLM2-135M ($LATHE_SMOLLM2); tokenizer_config.json carries the chat template and the special tokens.
# The same for a SentencePiece GGUF (stories260K). Exits 77 (ctest SKIP) when
# PyPI cannot be reached or SmolLM2 is absent (a failure with LATHE_REQUIRE_ALL=1).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/train_e2e_lib.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
TOKENIZERS_VERSION=0.23.3
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/lathe/tok-venv"
SMOL="${LATHE_SMOLLM2:-}"
if [ -z "$SMOL" ] || [ ! -f "$SMOL" ]; then
  if [ "${LATHE_REQUIRE_ALL:-0}" = 1 ]; then echo "FAIL: LATHE_SMOLLM2 not set or missing"; exit 1; fi
  echo "SKIP: LATHE_SMOLLM2 not set (scripts/fetch-models.sh)"; exit 77
fi
. "$HERE/../pip_venv.sh"
lathe_pip_venv "$VENV" "import tokenizers, sys; sys.exit(tokenizers.__version__ != '$TOKENIZERS_VERSION')" \
  "tokenizers==$TOKENIZERS_VERSION"

cat > "$tmp/f.yaml" <<YAML
model_name_or_path: $SMOL
stage: sft
finetuning_type: freeze
freeze_trainable_layers: 1
dataset: identity
dataset_dir: $DATA
template: chatml
cutoff_len: 48
max_samples: 4
per_device_train_batch_size: 2
max_steps: 1
learning_rate: 1.0e-5
output_dir: $tmp/out
YAML
"$LATHE" train "$tmp/f.yaml" -t 2 2> "$tmp/train.log"
check "freeze train exit" test $? -eq 0
for f in tokenizer.json tokenizer_config.json special_tokens_map.json config.json model.safetensors; do
  check "output $f" test -f "$tmp/out/$f"
done
check "no 'no tokenizer' note" bash -c "! grep -q 'has no tokenizer files' '$tmp/train.log'"

texts=("<|im_start|>user
What is 12345 + 678? Café déjà vu 🦙<|im_end|>
<|im_start|>assistant
" "  Once upon a time,	there was a little girl named Lily.\n\nShe liked 3.14159 and 100,000 apples!" "")
i=0
for t in "${texts[@]}"; do
  "$LATHE" tokenize -m "$SMOL" --json "$t" > "$tmp/ids$i.json" 2> "$tmp/tok.err"
  check "lathe tokenize $i" test $? -eq 0
  printf '%s' "$t" > "$tmp/text$i.txt"
  check "tokenizers reads tokenizer.json: same ids ($i)" "$VENV/bin/python" -c "
import json, sys
from tokenizers import Tokenizer
t = Tokenizer.from_file('$tmp/out/tokenizer.json')
text = open('$tmp/text$i.txt', encoding='utf-8').read()
want = json.load(open('$tmp/ids$i.json'))['ids']
got = t.encode(text).ids
assert got == want, (got, want)
assert t.decode(got, skip_special_tokens=False) == text, t.decode(got)
"
  i=$((i + 1))
done
check "tokenizer_config: chat template and specials" python3 -c "
import json
c = json.load(open('$tmp/out/tokenizer_config.json'))
assert '<|im_start|>' in c['chat_template'], c
assert c['eos_token'] == '<|im_end|>' and c['add_bos_token'] is False, c
s = json.load(open('$tmp/out/special_tokens_map.json'))
assert s['eos_token'] == '<|im_end|>', s
"
# The exported folder is a model lathe loads, with its own tokenizer now.
"$LATHE" tokenize -m "$tmp/out" --json "${texts[0]}" > "$tmp/ids_dir.json" 2> "$tmp/tok_dir.err"
check "lathe tokenize -m the HF folder: same ids" cmp "$tmp/ids_dir.json" "$tmp/ids0.json"

# A SentencePiece GGUF (stories260K: no merges in the file; the exported ones derived from the scores): the same
# check on TinyStories text and a chat-like string with specials.
sed -e "s|model_name_or_path: .*|model_name_or_path: $STORIES/stories260K.gguf|" -e "s|output_dir: .*|output_dir: $tmp/spm|" \
  -e "s|template: chatml|template: alpaca|" "$tmp/f.yaml" > "$tmp/spm.yaml"
"$LATHE" train "$tmp/spm.yaml" -t 2 2> "$tmp/spm.log"
check "spm freeze train exit" test $? -eq 0
check "spm: tokenizer.json written" test -f "$tmp/spm/tokenizer.json"
head -c 3000 "$SHARED/data/tinystories/validation_100.txt" > "$tmp/spm_text0.txt"
printf '%s' "<s> Hello</s>  world
 Once upon a time 123 café 🦙" > "$tmp/spm_text1.txt"
for i in 0 1; do
  "$LATHE" tokenize -m "$STORIES/stories260K.gguf" --json "$(cat "$tmp/spm_text$i.txt")" > "$tmp/spm_ids$i.json" 2> "$tmp/tok.err"
  check "spm: tokenizers gives lathe's ids ($i)" "$VENV/bin/python" -c "
import json
from tokenizers import Tokenizer
t = Tokenizer.from_file('$tmp/spm/tokenizer.json')
text = open('$tmp/spm_text$i.txt', encoding='utf-8').read()
want = json.load(open('$tmp/spm_ids$i.json'))['ids']
got = t.encode(text).ids
assert got == want, (got[:40], want[:40])
"
done

echo "tokenizer export e2e: $pass passed, $fails failed"
test $fails -eq 0
