@torch.no_grad()
def eval_loss_ddp(val_loader):
    model.eval()
    total, count = torch.tensor(0.0, device=device), torch.tensor(0, device=device)
    for xb, yb in val_loader:
        xb, yb = xb.to(device), yb.to(device)
        _, loss = model(xb, yb)
        total += loss.detach()
        count += 1
    # All-reduce (sum) across ranks
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    model.train()
    return (total / count).item()
