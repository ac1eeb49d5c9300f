// Prototype (scripts/proto/README.md).
// Is the row-sum gap at 64 MiB the kernel or the timing harness? kfuse's generated kernels
// beside a hand-written one, under two harnesses and two kinds of data.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "kf_rowsum.cuh"
#define CK(x) do{cudaError_t e=(x); if(e){printf("err %s line %d\n",cudaGetErrorString(e),__LINE__); exit(1);} }while(0)
__device__ __forceinline__ float bsum(uint4 v){ const __nv_bfloat162* h=(const __nv_bfloat162*)&v; float s=0; for(int i=0;i<4;i++){ float2 f=__bfloat1622float2(h[i]); s+=f.x+f.y; } return s; }
__global__ void __launch_bounds__(128) hand1024(const uint4* __restrict__ x, __nv_bfloat16* out){
  int warp=threadIdx.x>>5, lane=threadIdx.x&31; long long row=blockIdx.x*4LL+warp; uint4 r[4];
  for(int i=0;i<4;i++) r[i]=__ldg(x+row*128+i*32+lane); float s=0; for(int i=0;i<4;i++) s+=bsum(r[i]);
  for(int m=16;m;m>>=1) s+=__shfl_xor_sync(~0u,s,m); if(lane==0) out[row]=__float2bfloat16(s); }
__global__ void flushk(const uint4* __restrict__ x, long long nv, float* out){ float s=0; for(long long i=blockIdx.x*256LL+threadIdx.x;i<nv;i+=(long long)gridDim.x*256) s+=bsum(__ldg(x+i)); if(s==1234.5f) out[0]=s; }
__global__ void randomize(unsigned* p, long long n, unsigned seed){ for(long long i=blockIdx.x*256LL+threadIdx.x;i<n;i+=(long long)gridDim.x*256){ unsigned h=(unsigned)i*2654435761u^seed; h^=h>>13; h*=0x5bd1e995; h^=h>>15; unsigned a=(h&0x7fff)|0x3c00, b=((h>>16)&0x7fff)|0x3c00; p[i]= (a&0xbfff) | ((b&0xbfff)<<16);} }
int main(){
  const long long n=32768LL*1024, nb=n*2, fl=1LL<<28;
  unsigned short *x,*f; unsigned short* o; float* fo; CK(cudaMalloc(&x,nb)); CK(cudaMalloc(&f,fl)); CK(cudaMalloc(&o,32768*2)); CK(cudaMalloc(&fo,64));
  randomize<<<1024,256>>>((unsigned*)f, fl/4, 7); CK(cudaDeviceSynchronize());
  void *ca,*cb; long long cn=1LL<<29; CK(cudaMalloc(&ca,cn)); CK(cudaMalloc(&cb,cn));
  cudaEvent_t e0[60],e1[60]; for(int i=0;i<60;i++){cudaEventCreate(&e0[i]); cudaEventCreate(&e1[i]);}
  int flushkind=0;
  auto flush=[&]{ if(flushkind==0) flushk<<<132*8,256>>>((const uint4*)f, fl/16, fo); else kf_row_sum_4096<<<32768,128>>>(f,4096,o,32768,4096); };
  auto timeit=[&](const char* name, auto launch, double bytes, bool queued){
    std::vector<float> t; 
    for(int it=0;it<60;it++){ flush(); cudaEventRecord(e0[it]); launch(); cudaEventRecord(e1[it]); if(!queued) cudaEventSynchronize(e1[it]); }
    CK(cudaDeviceSynchronize());
    for(int it=10;it<60;it++){ float ms; cudaEventElapsedTime(&ms,e0[it],e1[it]); t.push_back(ms);} 
    std::sort(t.begin(),t.end()); float m=t[t.size()/2]; return bytes/m/1e6; };
  for(int data=0; data<2; data++){
    if(data==0) CK(cudaMemset(x,0x3f,nb)); else randomize<<<1024,256>>>((unsigned*)x, nb/4, 3);
    CK(cudaDeviceSynchronize());
    for(flushkind=0; flushkind<2; flushkind++) for(int queued=0; queued<2; queued++){
      double copy = timeit("copy", [&]{ cudaMemcpyAsync(cb,ca,cn,cudaMemcpyDeviceToDevice); }, 2.0*cn, queued);
      double a = timeit("", [&]{ hand1024<<<8192,128>>>((const uint4*)x,(__nv_bfloat16*)o); }, nb, queued);
      double b = timeit("", [&]{ kf_row_sum_1024<<<8192,128>>>(x,1024,o,32768,1024); }, nb, queued);
      double c = timeit("", [&]{ kf_row_sum_4096<<<8192,128>>>(x,4096,o,8192,4096); }, nb, queued);
      printf("data=%s flush=%s %s: copy %.0f GB/s | hand1024 %.1f%% | kf1024 %.1f%% | kf4096 %.1f%%\n", data?"random":"memset", flushkind?"kf_row_sum":"gridstride", queued?"queued":"sync-each", copy, 100*a/copy, 100*b/copy, 100*c/copy);
    }
  }
  return 0; }
