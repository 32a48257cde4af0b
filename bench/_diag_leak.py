# temporary diagnosis (deleted after use): where does the first backward capture's leaked block come from?
import torch, sys
sys.path.insert(0, ".")
from harness.slotmem import capture as cap_mod, allocator as alloc
from harness.slotmem.plan import plan_pipeline
sys.path.insert(0, "tests/slotmem")
from test_capture_gpu import make_layers, sampler
torch.cuda.memory._record_memory_history(max_entries=200000)
orig = cap_mod._Capturer._rewind
def rewind(self, pre, module, outs, name):
    try:
        orig(self, pre, module, outs, name)
    except alloc.PoolStateError as e:
        print("LEAK", e)
        extra = alloc.live_ptrs(self.pool.id) - pre.live
        snap = torch.cuda.memory._snapshot()
        for seg in snap["segments"]:
            a = seg["address"]
            for b in seg["blocks"]:
                if a in extra:
                    print("block", hex(a), b["size"], b["state"])
                    for f in b.get("frames", [])[:40]:
                        print("   ", f.get("filename", "")[-60:], f.get("line"), f.get("name", "")[:120])
                a += b["size"]
        raise
cap_mod._Capturer._rewind = rewind
plan = plan_pipeline(2, 2, (4, 6, 8), (1, 2), 2).ranks[0]
model = make_layers((2, 2), torch.float32)
g = cap_mod.capture_plan(model, sampler(torch.float32), plan)
print("OK", g.memory())
