// Prototype (scripts/proto/README.md).
// Times kfuse's generated cluster row kernels (cubins `inspect` writes: layer_norm_*,
// rms_norm_w_*, softmax_* at 1024x131072 and 256x262144) under the driver's cluster
// scheduling policies — the default launch (cuLaunchKernel, as the runtime does), and
// cuLaunchKernelEx asking for SPREAD or LOAD_BALANCING — with the clusters the driver
// says fit at once under each, and checks the outputs agree. Same timing as the other
// row harnesses: a 256 MiB read evicts the L2 before each launch, CUDA events, median.
//   nvcc -O3 -arch=sm_90a -std=c++17 cluster_policy_harness.cu -lcuda -o harness
//   ./harness DIR/*.cubin
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
#include <algorithm>
#include <cmath>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#define CK(x) do{CUresult e_=(x); if(e_){const char* s_; cuGetErrorString(e_,&s_); printf("err %s line %d\n",s_,__LINE__); exit(1);} }while(0)
#define CR(x) do{cudaError_t e_=(x); if(e_){printf("err %s line %d\n",cudaGetErrorString(e_),__LINE__); exit(1);} }while(0)
__global__ void fill(__nv_bfloat16* p, long long n, unsigned seed){ for(long long i=blockIdx.x*256LL+threadIdx.x;i<n;i+=(long long)gridDim.x*256){ unsigned h=(unsigned)i*2654435761u^seed; h^=h>>13; h*=0x5bd1e995; h^=h>>15; float u=(h&0xffffff)/16777216.0f; p[i]=__float2bfloat16(4.0f*u-2.0f+(seed==5?1.0f:0.f)); } }
__global__ void evict(const uint4* __restrict__ x, long long nv, float* out){ float s=0; for(long long i=blockIdx.x*256LL+threadIdx.x;i<nv;i+=(long long)gridDim.x*256){ uint4 v=__ldg(x+i); s+=__uint_as_float(v.x)+__uint_as_float(v.w);} if(s==1234.5f) out[0]=s; }
int main(int argc, char** argv){
  CR(cudaFree(0));
  const long long E=1LL<<27, fl=1LL<<28; __nv_bfloat16 *x,*w,*b,*y; float *mean,*rstd,*fo; void* f;
  CR(cudaMalloc(&x,E*2)); CR(cudaMalloc(&y,E*2)); CR(cudaMalloc(&w,262144*2)); CR(cudaMalloc(&b,262144*2)); CR(cudaMalloc(&mean,4096*4)); CR(cudaMalloc(&rstd,4096*4)); CR(cudaMalloc(&f,fl)); CR(cudaMalloc(&fo,64));
  fill<<<1024,256>>>(x,E,3); fill<<<64,256>>>(w,262144,5); fill<<<64,256>>>(b,262144,7); CR(cudaDeviceSynchronize());
  void *ca,*cb; long long cn=1LL<<29; CR(cudaMalloc(&ca,cn)); CR(cudaMalloc(&cb,cn));
  cudaEvent_t e0,e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto timeit=[&](auto launch)->float{ std::vector<float> t; for(int it=0;it<48;it++){ evict<<<132*8,256>>>((const uint4*)f, fl/16, fo); cudaEventRecord(e0); launch(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms,e0,e1); if(it>=8) t.push_back(ms);} CR(cudaGetLastError()); std::sort(t.begin(),t.end()); return t[t.size()/2]; };
  float cms = timeit([&]{ cudaMemcpyAsync(cb,ca,cn,cudaMemcpyDeviceToDevice); }); double copy = 2.0*cn/cms/1e6; printf("copy %.0f GB/s\n", copy);
  for(int a=1; a<argc; a++){
    std::string path=argv[a];
    bool ln = path.find("layer_norm")!=std::string::npos, rms = path.find("rms_norm_w")!=std::string::npos;
    long long M, N; unsigned ctas;
    if(path.find("1024x131072")!=std::string::npos){M=1024;N=131072;ctas=8;} else {M=256;N=262144;ctas=16;}
    double bytes = 2.0*M*N*2;
    CUmodule mod; CUfunction fn; CK(cuModuleLoad(&mod, path.c_str()));
    CK(cuModuleGetFunction(&fn, mod, ln? "kf_layer_norm" : rms? "kf_rms_norm_w" : "kf_softmax"));
    CK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
    long long st=N; float eps=1e-5f; void* px=x; void* pw=w; void* pb=b; void* py=y; void* pm=mean; void* pr=rstd;
    void* sargs[]={&px,&st,&py,&st,&M,&N}; void* largs[]={&px,&st,&pw,&pb,&py,&st,&pm,&pr,&eps,&M,&N}; void* rargs[]={&px,&st,&pw,&py,&st,&pr,&eps,&M,&N};
    void** args = ln? largs : rms? rargs : sargs;
    std::vector<__nv_bfloat16> ref;
    const char* names[3]={"default launch","SPREAD","LOAD_BALANCING"};
    for(int pol=0; pol<3; pol++){
      CUlaunchAttribute at[1]; at[0].id=CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
      at[0].value.clusterSchedulingPolicyPreference = pol==1? CU_CLUSTER_SCHEDULING_POLICY_SPREAD : CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING;
      CUlaunchConfig cfg={}; cfg.gridDimX=M*ctas; cfg.gridDimY=1; cfg.gridDimZ=1; cfg.blockDimX=256; cfg.blockDimY=1; cfg.blockDimZ=1; cfg.sharedMemBytes=0; cfg.hStream=0;
      cfg.attrs = pol? at : nullptr; cfg.numAttrs = pol? 1 : 0;
      int clusters=-1; CUresult oc = cuOccupancyMaxActiveClusters(&clusters, fn, &cfg); if(oc) clusters=-1;
      CR(cudaMemset(y, 0xff, M*N*2));
      auto go=[&]{ if(pol==0) CK(cuLaunchKernel(fn, M*ctas,1,1, 256,1,1, 0, 0, args, nullptr)); else CK(cuLaunchKernelEx(&cfg, fn, args, nullptr)); };
      float ms = timeit(go);
      std::vector<__nv_bfloat16> h(M*N); CR(cudaMemcpy(h.data(),y,M*N*2,cudaMemcpyDeviceToHost));
      double num=0, den=0; long long bad=0;
      if(pol==0) ref=h; else for(long long i=0;i<M*N;i++){ double p=__bfloat162float(ref[i]), q=__bfloat162float(h[i]); if(!std::isfinite(p)||!std::isfinite(q)){bad++;continue;} num+=(p-q)*(p-q); den+=p*p; }
      printf("%-28s %-15s %3d clusters at once  %.4f ms  %.1f%% of copy  (vs default: diff %.1e, non-finite %lld)\n", path.substr(path.rfind('/')+1).c_str(), names[pol], clusters, ms, 100*bytes/ms/1e6/copy, pol? sqrt(num/std::max(den,1e-30)) : 0.0, bad);
    }
  }
  return 0; }
