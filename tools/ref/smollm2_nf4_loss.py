# torch + bitsandbytes cross-check of QLoRA's base error on SmolLM2-135M-Instruct (bench/RESULTS.md,
# "QLoRA accuracy"): LM loss of the Q4_1 GGUF (dequantized to f32 by transformers) over the first 24
# alpaca_en_demo records in chatml (128 tokens each), then with every decoder linear replaced by
# bitsandbytes' Linear4bit NF4 + double quant (bench/train_torch.py's quantize_linears), f32 compute.
# Run: /root/.cache/lathe/refenv/bin/python tools/ref/smollm2_nf4_loss.py  (one thread, ~5 min here)
import json, os, sys, time, torch
torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from transformers import AutoModelForCausalLM, AutoTokenizer
d = os.path.expanduser(os.environ.get("MODELS", "~/.cache/lathe/models"))
t0 = time.time()
tok = AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
model = AutoModelForCausalLM.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", torch_dtype=torch.float32)
model.eval()
print("loaded", time.time() - t0, flush=True)
data = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data", "llamafactory", "alpaca_en_demo.json")))[:24]
texts = [f"<|im_start|>user\n{r['instruction']} {r['input']}<|im_end|>\n<|im_start|>assistant\n{r['output']}<|im_end|>" for r in data]
def loss():
    tot, n = 0.0, 0
    with torch.no_grad():
        for s in texts:
            ids = tok(s, return_tensors="pt").input_ids[:, :128]
            out = model(input_ids=ids, labels=ids)
            tot += out.loss.item() * (ids.shape[1] - 1); n += ids.shape[1] - 1
    return tot / n
a = loss(); print("f32 (dequantized Q4_1) loss %.4f" % a, flush=True)
import train_torch
train_torch.quantize_linears(model, "nf4")
import bitsandbytes as bnb
for m in model.modules():
    if isinstance(m, bnb.nn.Linear4bit):
        m.compute_dtype = torch.float32  # f32 matmul on the dequantized NF4 weight (bf16 is slow here)
b = loss(); print("bnb nf4+dq loss %.4f (%+.2f%%)" % (b, 100 * (b - a) / a), flush=True)
