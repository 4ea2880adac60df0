// A stranger on the cluster port, for the security tests: it reaches the coordinator's CAF address
// as anyone on the network could (no token) and sends the messages only joined workers or the
// cluster's owner may send: done and stepfail for steps 0..63 of microbatches 0..1 (the ones in
// flight among them), a whole-stage failure, shutdown with a wrong token and without one, a timer.
// A coordinator that trusted any of them would end a request wrongly or go down.
// usage: conveyor_protocol_stranger HOST PORT
#include <cstdio>
#include <cstdlib>

#include "caf/io/all.hpp"
#include "conveyor/stage/protocol.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
    return 2;
  }
  caf::actor_system_config cfg;
  conveyor::stage::register_protocol(cfg);
  conveyor::stage::tune_actor_system(cfg);
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  auto coord = sys.middleman().remote_actor(argv[1], static_cast<std::uint16_t>(std::atoi(argv[2])));
  if (!coord) {
    std::fprintf(stderr, "cannot reach %s:%s: %s\n", argv[1], argv[2], sys.render(coord.error()).c_str());
    return 1;
  }
  using namespace conveyor::stage;
  for (std::uint64_t step = 0; step < 64; ++step) {
    for (std::uint64_t mb = 0; mb < 2; ++mb) {
      caf::anon_send(*coord, done_atom::value, mb, step, std::vector<std::int32_t>{7});
      caf::anon_send(*coord, step_fail_atom::value, std::int32_t{1}, mb, step, std::string("stranger"));
    }
  }
  caf::anon_send(*coord, step_fail_atom::value, std::int32_t{0}, UINT64_MAX, UINT64_MAX, std::string("stranger"));
  caf::anon_send(*coord, caf::atom("shutdown"), std::string("not the token"));
  caf::anon_send(*coord, caf::atom("shutdown"));
  caf::anon_send(*coord, caf::atom("tick"));
  // A stranger actor (a sender, but not a joined worker) tries the same.
  auto self = sys.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  caf::send_as(self, *coord, step_fail_atom::value, std::int32_t{0}, UINT64_MAX, UINT64_MAX, std::string("stranger"));
  caf::anon_send_exit(self, caf::exit_reason::user_shutdown);
  // A join without the token last: its refusal comes back over the same connection, after
  // everything above was delivered (so a test that passes was not merely too quick).
  caf::scoped_actor me{sys};
  int rc = 1;
  me->request(*coord, std::chrono::seconds(10), join_atom::value, std::string("no token"), protocol_version,
              std::int32_t{0}, std::int32_t{0}, std::int32_t{0}, caf::actor{})
      .receive([&](assign_atom, const stage_assignment&) { std::fprintf(stderr, "joined without the token!\n"); },
               [&](caf::error& err) {
                 std::printf("delivered; join refused: %s\n", sys.render(err).c_str());
                 rc = 0;
               });
  return rc;
}
