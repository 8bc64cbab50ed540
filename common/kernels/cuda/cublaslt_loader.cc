#include "common/kernels/cuda/cublaslt_loader.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::kernels::cuda {
namespace {

absl::StatusOr<CublasLt> Load() {
  const std::string soname = absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR);
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    lib = dlopen(absl::StrCat(TANDEM_CUDA_LIBRARY_DIR, "/", soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot load ", soname, " (", dlerror(),
                                                      "); install CUDA's cuBLAS or add its "
                                                      "directory to LD_LIBRARY_PATH"));
  }
  CublasLt f{};
  std::string missing;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  };
  bind(f.Create, "cublasLtCreate");
  bind(f.Destroy, "cublasLtDestroy");
  bind(f.MatmulDescCreate, "cublasLtMatmulDescCreate");
  bind(f.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  bind(f.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  bind(f.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  bind(f.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  bind(f.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  bind(f.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  bind(f.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  bind(f.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  bind(f.Matmul, "cublasLtMatmul");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(soname, " lacks ", missing));
  }
  return f;  // the library stays loaded for the process's lifetime
}

}  // namespace

absl::StatusOr<const CublasLt*> LoadCublasLt() {
  static const absl::StatusOr<CublasLt>* loaded = new absl::StatusOr<CublasLt>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace tandem::kernels::cuda
