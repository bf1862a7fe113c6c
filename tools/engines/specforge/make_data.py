# Build a tiny ShareGPT-style conversation jsonl from fixtures/toy-pair/prompts.jsonl.
# user = task header (text before the first ': '), assistant = the prompt's answer
# part continued greedily by the toy target on the raw text (24 new tokens, fp32).
import json, sys, torch
from transformers import AutoTokenizer, AutoModelForCausalLM
torch.set_num_threads(1)
target, prompts, out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tok = AutoTokenizer.from_pretrained(target)
m = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
with open(out, "w") as f:
    for i, line in enumerate(open(prompts).readlines()[:n]):
        t = json.loads(line)["text"]
        user, _, ans = t.partition(": ")
        ids = tok(t, return_tensors="pt", add_special_tokens=False).input_ids
        g = m.generate(ids, max_new_tokens=24, do_sample=False)
        reply = (ans + tok.decode(g[0, ids.shape[1]:])).strip()
        f.write(json.dumps({"id": f"toy-{i}", "conversations": [
            {"role": "user", "content": user}, {"role": "assistant", "content": reply}]}) + "\n")
