import collections, torch
from tests.models import MLP, eval_model
def test_x(caplog):
    m = eval_model(MLP()); x = torch.randn(4,16)
    for i in range(3):
        c = torch.compile(m, backend="trtrtx", options={"min_block_size":1,"target_compute_capabilities":[(8,6)]})
        with torch.no_grad(): c(x)
        torch._dynamo.reset()
    print(collections.Counter((r.name, r.levelname) for r in caplog.records))
    print(sum(len(r.getMessage()) for r in caplog.records))
