/* The sandbox ("pause") process of every pod: holds the pod's namespaces, reaps orphans,
 * exits on SIGINT/SIGTERM. Kubernetes' own is the same few lines (build/pause); no registry
 * serves it here, so the test bed compiles this one. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal) { _exit(0); }

static void reap(int signal) {
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop}, on_child = {.sa_handler = reap,
                                                               .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &on_stop, 0) || sigaction(SIGTERM, &on_stop, 0) ||
      sigaction(SIGCHLD, &on_child, 0))
    return 1;
  for (;;)
    pause();
}
