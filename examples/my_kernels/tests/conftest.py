import sys

# Block TileLang and TVM for every test here: the deploy target has neither, and nothing on the
# launch path may need them (my_kernels.kernels, the build-time module, is the one exception).
BLOCKED = ("tilelang", "tvm", "tvm_ffi")


class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in these tests: the deployed wheel must not need it")
        return None


sys.meta_path.insert(0, _Block())
