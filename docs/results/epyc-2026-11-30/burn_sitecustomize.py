import os, threading
if os.environ.get("PMI_RANK", "0") != "0" and os.environ.get("BURN"):
    import numpy as np
    def burn():
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        a = np.random.rand(256, 256).astype(np.float32)
        while True:
            a = (a @ a) * np.float32(1e-3) + np.float32(0.5)
    threading.Thread(target=burn, daemon=True).start()
