// From DRAM, 1 thread, CPU time: the same kernel over weights rotated through 256 MiB on 4 KiB vs 2 MiB pages,
// alternating rounds, medians. Args: M K [rounds]; built by run.sh.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <algorithm>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "common.h"
namespace lowbit { const KernelTable& kernels_new(); }
using namespace lowbit;
static double now(){timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc,char**argv){
  int64_t M=atoll(argv[1]), K=atoll(argv[2]); int rounds=argc>3?atoi(argv[3]):30;
  int64_t Kp=(K+63)/64*64, Mb=(M+63)/64, group=Kp, G=1;
  IntWeights w{}; w.bits=2; w.M=M; w.Kp=Kp; w.group=group; w.Mb=Mb; w.G=G; w.zc=1.f;
  int64_t nch=w.nch(), bytes=Mb*nch*256;
  int64_t stride=(bytes+ (2<<20)-1)/(2<<20)*(2<<20);
  int copies=std::max<int64_t>(2, (256ll<<20)/stride);
  uint8_t* buf[2];
  for(int v=0;v<2;++v){ buf[v]=(uint8_t*)aligned_alloc(2<<20, stride*copies); madvise(buf[v], stride*copies, v? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::mt19937 rng(1); for(int64_t i=0;i<stride*copies;++i) buf[v][i]=rng(); }
  std::vector<uint16_t> sc(Mb*G*64, f32_to_f16(0.01f)); w.scale=sc.data(); w.offset=nullptr;
  std::vector<int8_t> q(Kp,3); std::vector<float> as(G,0.02f); std::vector<int32_t> sum(G,0);
  ActQ a{q.data(),as.data(),sum.data(),1,Kp,group,G}; std::vector<float> y(M);
  std::vector<double> t[2]; int ci=0;
  for(int r=0;r<rounds;++r) for(int v=0;v<2;++v){ double tot=0;
    for(int i=0;i<copies;++i){ w.codes=buf[v]+(int64_t)(ci++%copies)*stride; double t0=now(); kernels_new().gemm_int(w,a,y.data(),M,0,Mb); tot+=now()-t0; }
    t[v].push_back(tot/copies);}
  for(int v=0;v<2;++v) std::sort(t[v].begin(),t[v].end());
  double o=t[0][rounds/2], n=t[1][rounds/2];
  printf("M=%ld K=%ld (%.2f MB) 1 thread DRAM: 4K pages %.1f us (%.1f GB/s)  2M pages %.1f us (%.1f GB/s)  ratio %.3f\n",(long)M,(long)K,bytes/1e6,o*1e6,bytes/o/1e9,n*1e6,bytes/n/1e9,o/n);
  system("grep AnonHuge /proc/self/status 2>/dev/null || true");
  char cmd[100]; snprintf(cmd,100,"grep AnonHugePages /proc/%d/smaps_rollup",getpid()); system(cmd);
}
