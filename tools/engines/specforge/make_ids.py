# Write {"input_ids": [...]} lines (record order data_0, data_1, ...) with SpecForge's
# trailing right-padding (input_ids 0 and loss_mask 0) removed, for `hsparity dump --prompts`.
import glob, json, re, sys, torch
files = sorted(glob.glob(sys.argv[1] + "/rows_*/data_*.ckpt"), key=lambda f: int(re.findall(r"data_(\d+)", f)[-1]))
for f in files:
    r = torch.load(f, map_location="cpu", weights_only=True)
    ids, mask = r["input_ids"].tolist(), r["loss_mask"].tolist()
    while ids and ids[-1] == 0 and mask[len(ids) - 1] == 0:
        ids.pop()
    print(json.dumps({"input_ids": ids}))
