#pragma once
// Launch attributes of the skinny GEMMs (skinny_gemm.cu, skinny_wgmma.cu): a programmatic dependent
// launch (PDL) and a thread-block cluster along x for their K splits.
#include <cuda_runtime.h>

namespace conveyor::kernels::cuda {

/// Fills `attr` for a launch that may start as a programmatic dependent (`pdl`) and, with
/// `cluster_x` > 1, runs in clusters of that many blocks along x; returns how many it set.
inline unsigned pdl_cluster_attrs(cudaLaunchAttribute (&attr)[2], bool pdl, int cluster_x) {
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(cluster_x);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  return n;
}

}  // namespace conveyor::kernels::cuda
