import os, atexit, time, sys, collections
if os.environ.get("PMI_RANK") == "0":
    acc = collections.defaultdict(lambda: [0, 0])
    seq = collections.Counter()
    import importlib
    def install():
        from pipeinfer.schedule import core
        from pipeinfer.engine.head import driver
        orig = core.Scheduler.step
        def step(self, event):
            t = time.thread_time_ns()
            acts = orig(self, event)
            k = type(event).__name__ + ("+" if acts else "-")
            e = acc[k]; e[0] += time.thread_time_ns() - t; e[1] += 1
            return acts
        core.Scheduler.step = step
        origturn = driver.Driver.turn
        def turn(self):
            r = origturn(self)
            seq["turn" + ("+" if r else "-")] += 1
            return r
        driver.Driver.turn = turn
    class F:
        def find_spec(self, name, path, target=None):
            if name == "pipeinfer.engine.head.driver":
                sys.meta_path.remove(self)
                import importlib.util
                spec = importlib.util.find_spec(name)
                ol = spec.loader.exec_module
                def ex(m):
                    ol(m); install()
                spec.loader.exec_module = ex
                return spec
    sys.meta_path.insert(0, F())
    def report():
        for k, (ns, n) in sorted(acc.items(), key=lambda x: -x[1][0]):
            sys.stderr.write(f"STEP {k}: {ns/1e6:.1f} ms in {n} ({ns/max(n,1)/1e3:.1f} us)\n")
        sys.stderr.write(f"TURNS {dict(seq)}\n")
    atexit.register(report)
if os.environ.get("PMI_RANK") == "0":
    waits = collections.Counter()
    def install2():
        from pipeinfer.engine.transport import mpi, backoff
        ol = mpi.Link.sleep
        def sl(self, seconds, channel=mpi.Channel.MAIN):
            with self._lock:
                pend = len(self._pending)
            r = ol(self, seconds, channel)
            b = "1e-5" if seconds < 1e-4 else "1e-4" if seconds < 1e-3 else "1e-3" if seconds < 4e-3 else "big"
            waits[(b, "pend" if pend else "-", "woken" if r else "timeout")] += 1
            return r
        mpi.Link.sleep = sl
        ow = backoff.IdleBackoff.wait
        def w(self):
            d = self.delay
            r = ow(self)
            if not d: waits["nosleep"] += 1
            return r
        backoff.IdleBackoff.wait = w
    _inst = install
    def install():
        _inst(); install2()
    def report2():
        for k, v in sorted(waits.items(), key=lambda x: -x[1]): sys.stderr.write(f"WAIT {k}: {v}\n")
    atexit.register(report2)
if os.environ.get("PMI_RANK") == "0":
    pends = collections.Counter()
    def install3():
        from pipeinfer.engine.transport import mpi
        ol = mpi.Link.sleep
        def sl(self, seconds, channel=mpi.Channel.MAIN):
            with self._lock:
                still = [(r, b) for r, b in self._pending if not r.Test()]
                for r, b in still:
                    pends[(getattr(b, "dtype", type(b).__name__).__str__(), getattr(b, "size", 0))] += 1
            return ol(self, seconds, channel)
        mpi.Link.sleep = sl
    _inst2 = install
    def install():
        _inst2(); install3()
    atexit.register(lambda: sys.stderr.write(f"PEND {dict(pends.most_common(10))}\n"))
if os.environ.get("PMI_RANK") == "0" and os.environ.get("TWICE"):
    def install4():
        from pipeinfer.engine.transport import mpi
        def probe(self, source, tag):
            status = mpi.MPI.Status()
            source = mpi.MPI.ANY_SOURCE if source is None else source
            if self.comm.Iprobe(source=source, tag=int(tag), status=status) or \
               self.comm.Iprobe(source=source, tag=int(tag), status=status):
                return status
            return None
        mpi.Link.probe = probe
    _inst3 = install
    def install():
        _inst3(); install4()
if os.environ.get("PMI_RANK") == "0" and os.environ.get("QUIET"):
    def install5():
        from pipeinfer.engine.transport import backoff
        backoff.WOKEN_QUIET_S = float(os.environ["QUIET"])
    _inst4 = install
    def install():
        _inst4(); install5()
