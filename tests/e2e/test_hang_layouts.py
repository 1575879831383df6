"""Hang reports for the layouts past data parallelism, on 2 gloo ranks under `phalanx
watch`: a tensor-parallel model evaluated on rank 0 only (rank 0 waits in tensor
parallelism's all-reduce of the row-wise layer's output, which DTensor waits on where the
output is used), and a pipeline whose last stage has one batch fewer (the first stage
waits to send its activations to a stage that has left the loop)."""

from __future__ import annotations

from test_hang_sharded import MARK, _at, _hang

TP_EVAL_ON_RANK_0 = MARK + '''from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
torch.manual_seed(0)
model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
mark(rank)
if rank == 0:
    with torch.no_grad():
        print("eval", model(torch.randn(4, 8)).sum().item())
dist.barrier()
dist.destroy_process_group()
'''

PP_LAST_STAGE_SHORT = MARK + '''from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
torch.manual_seed(0)
stage = PipelineStage(torch.nn.Linear(8, 8), rank, 2, torch.device("cpu"),
                      group=mesh.get_group())
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, y: out.sum())
batches = [torch.randn(4, 8) for _ in range(3 - rank)]  # the last stage has one batch fewer
for batch in batches:
    mark(rank)
    if rank == 0:
        schedule.step(batch)
    else:
        schedule.step(target=batch, losses=[])
mark(rank)
dist.barrier()
dist.destroy_process_group()
'''


def test_a_tensor_parallel_forward_on_rank_0_only_names_tensor_parallelism(tmp_path):
    src = TP_EVAL_ON_RANK_0
    report, stderr = _hang(tmp_path, src)
    evaluation = _at(src, 'print("eval"')
    cause = (f"rank(s) 0 are in tensor parallelism's collective (a DTensor layer's output "
             f"all-reduced or gathered, waited on where it is used) at "
             f"{evaluation} in <module>(), reached only under "
             f"`if rank == 0:` at {_at(src, 'if rank == 0')}; rank 1 is in barrier at "
             f"{_at(src, 'barrier()')} in <module>() — they never join it.")
    assert f"Most likely cause: {cause}" in report, report
    assert cause in stderr


def test_a_pipeline_stage_with_fewer_batches_names_the_send_and_the_loop(tmp_path):
    src = PP_LAST_STAGE_SHORT
    report, _ = _hang(tmp_path, src)
    step = _at(src, "schedule.step(batch)")
    assert (f"rank 0: in the pipeline schedule's send/recv between stages (sending "
            f"activations to the next stage) at {step}") in report, report
    assert (f"Most likely cause: rank(s) 0 are in the pipeline schedule's send/recv between "
            f"stages (sending activations to the next stage) at {step} in <module>(), and "
            f"the stage it waits for never answers; rank 1 is in barrier at "
            f"{_at(src, 'barrier()')} in <module>() — rank(s) 1 left the loop at "
            f"{_at(src, 'for batch in')}, so the stages ran the schedule a different number "
            f"of times.") in report, report
