// Prints a fresh set of CurveZMQ keys as the job file's [security] section.
#include <cstdio>

#include "common/error.h"
#include "common/transport/transport.h"

int main() {
  try {
    auto server = shoal::CurveKeyPair();
    auto client = shoal::CurveKeyPair();
    printf("[security]\n");
    printf("server_public_key = \"%s\"\n", server.first.c_str());
    printf("server_secret_key = \"%s\"\n", server.second.c_str());
    printf("client_public_key = \"%s\"\n", client.first.c_str());
    printf("client_secret_key = \"%s\"\n", client.second.c_str());
    return 0;
  } catch (const shoal::Error& e) {
    fprintf(stderr, "shoal-keygen: %s\n", e.what());
    return 1;
  }
}
