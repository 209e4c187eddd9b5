// RSR one-token step 1 on AVX-512: vpgatherdd + in-register prefix against the scalar 4-chain prefix (issue 7).
//     g++ -O3 -march=native scripts/rsr_gather_probe.cpp -o /tmp/g && /tmp/g
#include <immintrin.h>
#include <x86intrin.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <random>
#include <algorithm>
int main(){
  const int K=16384; std::mt19937 rng(1);
  // sort by random 11-bit keys to mimic RSR (stable within a key)
  std::vector<int> key(K); for(int i=0;i<K;i++) key[i]=rng()%2048;
  std::vector<uint16_t> p2(K); for(int i=0;i<K;i++) p2[i]=i; std::stable_sort(p2.begin(),p2.end(),[&](int a,int b){return key[a]<key[b];});
  std::vector<float> x(K); for(auto&v:x) v=(rng()%200)/100.f-1;
  std::vector<float> C(K+16,0);
  for (int variant=0; variant<3; ++variant) {
    uint64_t best=~0ull;
    for(int rep=0;rep<2000;rep++){
      uint64_t t0=__rdtsc();
      if(variant==0){ // gather + in-register prefix + store
        __m512 carry=_mm512_setzero_ps();
        const __m512i last=_mm512_set1_epi32(15);
        for(int l=0;l<K;l+=16){
          __m512i idx=_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p2.data()+l)));
          __m512 v=_mm512_i32gather_ps(idx,x.data(),4);
          __m512 z=_mm512_setzero_ps();
          v=_mm512_add_ps(v,_mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v),_mm512_castps_si512(z),15)));
          v=_mm512_add_ps(v,_mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v),_mm512_castps_si512(z),14)));
          v=_mm512_add_ps(v,_mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v),_mm512_castps_si512(z),12)));
          v=_mm512_add_ps(v,_mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v),_mm512_castps_si512(z),8)));
          v=_mm512_add_ps(v,carry);
          _mm512_storeu_ps(C.data()+1+l,v);
          carry=_mm512_permutexvar_ps(last,v);
        }
      } else if(variant==1){ // gather only (sum)
        __m512 acc=_mm512_setzero_ps();
        for(int l=0;l<K;l+=16){
          __m512i idx=_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p2.data()+l)));
          acc=_mm512_add_ps(acc,_mm512_i32gather_ps(idx,x.data(),4));
        }
        _mm512_storeu_ps(C.data(),acc);
      } else { // scalar 4 chains interleaved
        float r0=0,r1=0,r2=0,r3=0;
        for(int l=0;l<K;l+=4){ uint64_t w; __builtin_memcpy(&w,p2.data()+l,8);
          r0+=x[w&0xffff]; r1+=x[(w>>16)&0xffff]; r2+=x[(w>>32)&0xffff]; r3+=x[w>>48];
          C[l+1]=r0;C[l+2]=r1;C[l+3]=r2;C[l+4]=r3; }
      }
      uint64_t t=__rdtsc()-t0; if(t<best)best=t;
    }
    printf("variant %d: %.3f ticks/input\n",variant,(double)best/K);
  }
}
