ckpt = torch.load("ckpt.pt", map_location="cpu")
model.module.load_state_dict(ckpt["model"])  # after wrapping with DDP
opt.load_state_dict(ckpt["opt"])
