/* first_touch: what the first write of new anonymous memory costs on this machine, with 4 KiB pages and
 * with transparent huge pages (MADV_HUGEPAGE), written the way vserve's converter fills new cached
 * frames (261,120-byte frames, 340x256 RGB, one after the other). A fresh daemon pays this for every
 * byte of its frame cache until the cache is full (docs/BENCHMARKS.md, run s42).
 *
 *   cc -O2 benches/first_touch.c -o /tmp/first_touch
 *   /tmp/first_touch 0 24; /tmp/first_touch 1 24      # 4 KiB pages, then THP; 24 chunks of 64 MiB
 *
 * Prints the milliseconds per chunk and the total in microseconds per 4 KiB page. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s THP(0|1) CHUNKS\n", argv[0]);
        return 2;
    }
    int thp = atoi(argv[1]);
    int n = atoi(argv[2]);
    const size_t chunk = (size_t)64 << 20, huge = (size_t)2 << 20, frame = 261120;
    double total = 0;
    for (int c = 0; c < n; c++) {
        char *p = mmap(NULL, chunk + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        char *a = (char *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
        if (thp)
            madvise(a, chunk, MADV_HUGEPAGE);
        double t0 = now();
        for (size_t off = 0; off + frame <= chunk; off += frame)
            memset(a + off, (int)(off & 0xff), frame);
        double t1 = now();
        total += t1 - t0;
        printf("%.0f ", (t1 - t0) * 1e3);
        fflush(stdout);
    }
    printf("\n%s: %.0f ms in all, %.2f us per 4 KiB page\n", thp ? "THP" : "4 KiB pages", total * 1e3,
           total * 1e6 / ((double)n * chunk / 4096));
    return 0;
}
