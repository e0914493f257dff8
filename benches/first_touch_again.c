/* first_touch_again: whether memory this process touched and gave back costs as much to touch again
 * (docs/BENCHMARKS.md, run s48). Maps 512 MiB, writes a byte a 4 KiB page, unmaps, four times;
 * the argument is the seconds slept between rounds.
 *
 *   cc -O2 benches/first_touch_again.c -o /tmp/ft2 && /tmp/ft2 0 && /tmp/ft2 5
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=(size_t)512<<20; double sleep_s=atof(argv[1]);
  for(int r=0;r<4;r++){
    char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
    double t0=now(); for(size_t i=0;i<n;i+=4096)p[i]=1; double t=now()-t0;
    printf("round %d: %.2f us/page\n",r,t*1e6/(n/4096));
    munmap(p,n); if(sleep_s>0) usleep((useconds_t)(sleep_s*1e6));
  }
}
