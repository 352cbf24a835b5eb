// A stand-in for NVIDIA's libnvidia-ml.so.1 with just the four calls
// spotvisor's idle detection makes, so that its dlopen path and GPU
// accounting are tested on a machine without a GPU. Built as
// libnvidia-ml.so.1 in its own directory; tests put it on LD_LIBRARY_PATH.
//   FAKE_NVML_GPUS       number of devices (default 1)
//   FAKE_NVML_UTIL_FILE  a file holding the GPU utilisation percent, read on
//                        every call so a test can change it while running
// Not implemented: everything else in NVML, per-process accounting, errors
// other than "no such device".
#include <cstdio>
#include <cstdlib>

namespace {

unsigned Utilisation() {
  const char* path = std::getenv("FAKE_NVML_UTIL_FILE");
  if (path == nullptr) return 0;
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  unsigned v = 0;
  if (std::fscanf(f, "%u", &v) != 1) v = 0;
  std::fclose(f);
  return v;
}

unsigned Devices() {
  const char* n = std::getenv("FAKE_NVML_GPUS");
  return n ? static_cast<unsigned>(std::atoi(n)) : 1;
}

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;

}  // namespace

extern "C" {

struct nvmlUtilization_st {
  unsigned gpu;
  unsigned memory;
};

__attribute__((visibility("default"))) int nvmlInit_v2() { return kSuccess; }

__attribute__((visibility("default"))) int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = Devices();
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (index >= Devices()) return kInvalidArgument;
  *device = reinterpret_cast<void*>(static_cast<unsigned long>(index) + 1);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetUtilizationRates(void* device, nvmlUtilization_st* u) {
  if (device == nullptr) return kInvalidArgument;
  u->gpu = Utilisation();
  u->memory = 0;
  return kSuccess;
}

}  // extern "C"
