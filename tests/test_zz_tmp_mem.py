import gc, logging, tracemalloc, torch
from tests.models import MLP, eval_model
def test_x(monkeypatch):
    monkeypatch.setattr(logging.getLogger("torch.__trace"), "propagate", False)
    m = eval_model(MLP()); x = torch.randn(4,16)
    def cyc(n):
        for i in range(n):
            c = torch.compile(m, backend="trtrtx", options={"min_block_size":1,"target_compute_capabilities":[(8,6)]})
            with torch.no_grad(): c(x)
            del c; torch._dynamo.reset(); gc.collect()
    cyc(5)
    tracemalloc.start(10)
    s1 = tracemalloc.take_snapshot()
    cyc(15)
    s2 = tracemalloc.take_snapshot()
    for st in s2.compare_to(s1, "traceback")[:4]:
        print(st.size_diff, st.count_diff)
        print("\n".join(st.traceback.format()[-12:]))
