/* first_touch: what the first write of new anonymous memory costs on this machine, with 4 KiB pages and
 * with transparent huge pages (MADV_HUGEPAGE), written the way vserve's converter fills new cached
 * frames (261,120-byte frames, 340x256 RGB, one after the other). A fresh daemon pays this for every
 * byte of its frame cache until the cache is full (docs/BENCHMARKS.md, run s42).
 *
 *   cc -O2 benches/first_touch.c -o /tmp/first_touch
 *   /tmp/first_touch 0 24; /tmp/first_touch 1 24      # 4 KiB pages, then THP; 24 chunks of 64 MiB
 *   /tmp/first_touch 2 24; /tmp/first_touch 3 24      # faulted in ahead: MAP_POPULATE, MADV_POPULATE_WRITE
 *
 * Prints the milliseconds per chunk and the total in microseconds per 4 KiB page. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODE(0 4 KiB | 1 THP | 2 MAP_POPULATE | 3 MADV_POPULATE_WRITE) CHUNKS\n", argv[0]);
        return 2;
    }
    int mode = atoi(argv[1]), thp = mode == 1;
    int n = atoi(argv[2]);
    const size_t chunk = (size_t)64 << 20, huge = (size_t)2 << 20, frame = 261120;
    double total = 0;
    for (int c = 0; c < n; c++) {
        /* Populating is timed with the writes: it is the same first touch, done by the kernel ahead. */
        double t0 = now();
        int flags = MAP_PRIVATE | MAP_ANONYMOUS | (mode == 2 ? MAP_POPULATE : 0);
        char *p = mmap(NULL, chunk + huge, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        char *a = (char *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
        if (thp)
            madvise(a, chunk, MADV_HUGEPAGE);
        if (mode == 3)
            madvise(a, chunk, MADV_POPULATE_WRITE);
        for (size_t off = 0; off + frame <= chunk; off += frame)
            memset(a + off, (int)(off & 0xff), frame);
        double t1 = now();
        total += t1 - t0;
        printf("%.0f ", (t1 - t0) * 1e3);
        fflush(stdout);
    }
    const char *names[] = {"4 KiB pages", "THP", "MAP_POPULATE", "MADV_POPULATE_WRITE"};
    printf("\n%s: %.0f ms in all, %.2f us per 4 KiB page\n", names[mode & 3], total * 1e3,
           total * 1e6 / ((double)n * chunk / 4096));
    return 0;
}
