// In cache, 1 thread: the old and new AVX2 gemm_int (2-bit, N = 1) on random codes: bitwise-equal check and
// min-of-rounds time, alternating. Args: M K group(0 = per row) [bits [rounds [max]]]; built by run.sh.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <chrono>
#include <algorithm>
#include "common.h"
namespace lowbit { const KernelTable& kernels_old(); const KernelTable& kernels_new(); }
using namespace lowbit;
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
int main(int argc,char**argv){
  int64_t M=atoll(argv[1]), K=atoll(argv[2]), group=atoll(argv[3]); int bits=argc>4?atoi(argv[4]):2; int reps=argc>5?atoi(argv[5]):200;
  int64_t Kp=(K+63)/64*64, Mb=(M+63)/64, G=(Kp+group-1)/group; if(group==0){group=Kp;G=1;}
  std::mt19937 rng(1);
  IntWeights w{}; w.bits=bits; w.M=M; w.Kp=Kp; w.group=group; w.Mb=Mb; w.G=G; w.zc=1.f;
  int64_t nch=w.nch();
  std::vector<uint8_t> codes(Mb*nch*256); for(auto&c:codes)c=rng();
  std::vector<uint16_t> sc(Mb*G*64); for(auto&s:sc)s=f32_to_f16(0.01f*(1+rng()%100));
  w.codes=codes.data(); w.scale=sc.data(); w.offset=nullptr;
  std::vector<int8_t> q(Kp); for(int64_t k=0;k<Kp;++k) q[k]= k<K ? (int8_t)((int)(rng()%255)-127) : 0;
  q[0]=127; q[1]=127; q[2]=-127;
  if(argc>6){ for(auto&c:codes)c=0xFF; for(int64_t k=0;k<K;++k) q[k]=127;}
  std::vector<float> as(G,0.02f); std::vector<int32_t> sum(G,0);
  for(int64_t k=0;k<Kp;++k) sum[k/group]+=q[k];
  ActQ a{q.data(),as.data(),sum.data(),1,Kp,group,G};
  std::vector<float> y0(M),y1(M);
  kernels_old().gemm_int(w,a,y0.data(),M,0,Mb); kernels_new().gemm_int(w,a,y1.data(),M,0,Mb);
  int bad=0; for(int64_t i=0;i<M;++i) if(y0[i]!=y1[i]) {if(bad<5)printf("diff %ld %g %g\n",(long)i,y0[i],y1[i]); ++bad;}
  printf("M=%ld K=%ld group=%ld bits=%d: %d mismatches\n",(long)M,(long)K,(long)group,bits,bad);
  double best[2]={1e9,1e9};
  for(int round=0;round<reps;++round) for(int v=0;v<2;++v){
    const KernelTable& t = v? kernels_new(): kernels_old();
    double t0=now(); for(int r=0;r<10;++r) t.gemm_int(w,a,(v?y1:y0).data(),M,0,Mb); double dt=(now()-t0)/10;
    best[v]=std::min(best[v],dt);
  }
  double macs=(double)M*Kp;
  printf("old %.2f us %.1f GMAC/s | new %.2f us %.1f GMAC/s | new/old speed %.3f\n",best[0]*1e6,macs/best[0]/1e9,best[1]*1e6,macs/best[1]/1e9,best[0]/best[1]);
}
