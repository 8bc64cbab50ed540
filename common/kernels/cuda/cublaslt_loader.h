#pragma once

// cuBLASLt, loaded with dlopen when the first CUDA backend is created. Linking it would put its
// ~94 KB of thread-local storage into every thread of every Tandem process, GPU or not, and
// threads created with small stacks (civetweb's, under /metrics) then fail to start.

#include <cublasLt.h>

#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

// The entry points the backend uses.
struct CublasLt {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmul) Matmul;
};

// The library, loaded once (libcublasLt.so.<major> from the loader's path, else the toolkit's
// directory this binary was built against). FailedPrecondition naming what is missing.
absl::StatusOr<const CublasLt*> LoadCublasLt();

}  // namespace tandem::kernels::cuda
