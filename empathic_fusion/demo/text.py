"""Topic-bound sentence banks for the demo's stories, personal stories and reflections.

Each topic has its own vocabulary, so Sentence-BERT places a participant's story near the read
stories of the same topic: that closeness is how the demo plants its text signal.
"""
from __future__ import annotations

import numpy as np

TOPICS: dict[str, dict[str, list[str]]] = {
    "family": {
        "own": [
            "My grandmother raised me after my parents split up.",
            "Last winter my little brother moved back in with us.",
            "We argued for years, but my father finally called me on my birthday.",
            "Sunday dinners at my aunt's house kept our family together.",
            "When my daughter was born I understood my own mother much better.",
            "I still keep the letters my grandfather wrote to my grandmother.",
        ],
        "story": [
            "When my mother got sick I moved home to care for her, and we finally talked about my childhood.",
            "My sister and I had not spoken for five years until her wedding brought the whole family back together.",
            "Raising twins alone taught me that asking my parents for help was not a failure.",
            "My father never said he was proud of me, but I found my school drawings in his desk after he passed.",
        ],
        "relate": [
            "That reminded me so much of my own family and my grandmother.",
            "I felt that, because my parents and I went through the same thing.",
        ],
    },
    "work": {
        "own": [
            "I was laid off from my job at the factory after twelve years.",
            "My manager took credit for the project I had built for months.",
            "Starting my own bakery was the scariest career decision I ever made.",
            "I worked night shifts at the hospital while studying for my degree.",
            "The first time I led a team meeting my hands were shaking.",
            "Quitting a well paid office job to become a teacher changed my life.",
        ],
        "story": [
            "After I lost my job I spent months sending applications before a small company finally hired me.",
            "My boss criticized me in front of the whole office, and I had to decide whether to stay or leave.",
            "I failed my first startup and had to tell my employees that their jobs were gone.",
            "Getting promoted over my older colleagues made me feel lonely at work for a long time.",
        ],
        "relate": [
            "I could relate, because I also struggled to keep my job and my career going.",
            "That sounded just like my own experience at work with a difficult boss.",
        ],
    },
    "loss": {
        "own": [
            "My best friend died in a car accident when we were nineteen.",
            "We had to put down our old dog last spring and the house felt empty.",
            "I never got to say goodbye to my uncle before the funeral.",
            "Grief still surprises me in the grocery store when I see her favorite tea.",
            "After my husband passed I did not leave the house for weeks.",
            "Losing the baby was the darkest time of our marriage.",
        ],
        "story": [
            "When my brother died I kept calling his phone just to hear his voicemail greeting.",
            "The funeral was a blur, and only months later did the grief really hit me.",
            "My cat of sixteen years died in my arms, and I still set out two bowls some mornings.",
            "After my wife passed away, cooking her recipes was the only way I could feel close to her.",
        ],
        "relate": [
            "That hit me hard, because I lost someone I loved in the same way.",
            "I know that kind of grief and how the funeral never really ends it.",
        ],
    },
    "travel": {
        "own": [
            "I backpacked alone through Vietnam the summer after college.",
            "Our flight was cancelled and we slept on the airport floor in Lisbon.",
            "Climbing the mountain in Peru was the hardest hike of my life.",
            "I got lost in Tokyo without a phone and a stranger walked me to my hotel.",
            "Driving across the desert with my best friend felt like pure freedom.",
            "The train through the Alps made me fall in love with traveling.",
        ],
        "story": [
            "I missed my train in Italy and ended up spending the night with a family who fed me dinner.",
            "Traveling alone through India taught me to trust strangers and myself.",
            "Our road trip broke down in the middle of the desert, and we laughed until the tow truck came.",
            "Seeing the ocean for the first time at forty made me cry on the beach.",
        ],
        "relate": [
            "That reminded me of my own trip abroad and getting lost in a strange city.",
            "I loved that, because traveling alone changed me in the same way.",
        ],
    },
    "health": {
        "own": [
            "I was diagnosed with diabetes at twenty-five and had to relearn how to eat.",
            "Recovering from knee surgery took me almost a year of physical therapy.",
            "My panic attacks started in college and I hid them from everyone.",
            "Running my first marathon after chemotherapy felt like a miracle.",
            "Therapy helped me finally understand my depression.",
            "I spent my twelfth birthday in the hospital with a broken back.",
        ],
        "story": [
            "After my cancer diagnosis I learned to accept help from friends I had always helped.",
            "Living with chronic pain means planning every day around what my body allows.",
            "My anxiety kept me from leaving the house until a therapist helped me take small steps.",
            "Learning to walk again after the accident took two years of stubborn practice.",
        ],
        "relate": [
            "I understood that completely, because my own illness and recovery felt the same.",
            "That resonated with me, since I also fought with my health for years.",
        ],
    },
    "friendship": {
        "own": [
            "My childhood friend and I drifted apart after she moved away.",
            "A stranger at the gym became one of my closest friends.",
            "My friends threw me a surprise party when I felt completely alone.",
            "I betrayed a friend's trust in high school and still regret it.",
            "Our group of friends has met every Friday for ten years.",
            "My roommate helped me through the worst semester of my life.",
        ],
        "story": [
            "My best friend forgave me after I forgot her wedding, and our friendship grew stronger.",
            "Moving to a new city, I felt lonely until a neighbor invited me to her book club.",
            "A friend I had lost touch with called me out of nowhere the day I needed it most.",
            "We were best friends in school, drifted apart, and reconnected twenty years later.",
        ],
        "relate": [
            "That reminded me of my best friend and how we found each other again.",
            "I felt that, because my friends were there for me just like that.",
        ],
    },
}

DISTANT_REFLECTIONS = [
    "I honestly could not relate to that story very much.",
    "It was fine, but it did not feel connected to my life.",
    "I am not sure what to say about it, it felt far away from me.",
    "That was a nice story, I guess, but it did not move me.",
]
FILLER = [
    "I think about that a lot.",
    "It was a strange time.",
    "Anyway, that is what happened.",
    "I have never really told anyone that.",
]
AGENT_LINES = {
    "warm_up": "Hi there, it is good to see you again. How has your day been?",
    "warm_up_reply": "Pretty good, thanks, a bit busy.",
    "story_share": "Would you like to share a story that has been on your mind lately?",
    "story_receive": "Thank you for sharing that with me. Here are three stories from other people for you to read.",
    "reflection": "How did you relate to the story you just read, and what do you think the narrator felt?",
    "cool_down": "Thank you for talking with me today. See you next time.",
    "cool_down_reply": "Thank you, bye.",
}


def story_texts(rng: np.random.Generator) -> list[tuple[str, str]]:
    """(topic, text) for every story in the bank; each story adds one topical closing line."""
    stories = []
    for topic, bank in TOPICS.items():
        for text in bank["story"]:
            stories.append((topic, f"{text} {rng.choice(bank['own'])}"))
    return stories


def own_story(topic: str, n_utterances: int, rng: np.random.Generator) -> list[str]:
    """A participant's personal story told over several utterances."""
    sentences = list(rng.choice(TOPICS[topic]["own"], size=n_utterances, replace=False))
    if n_utterances > 2:
        sentences[-1] = f"{sentences[-1]} {rng.choice(FILLER)}"
    return sentences


def reflection(story_topic: str, relates: bool, rng: np.random.Generator) -> list[str]:
    """Two reflection utterances; relating ones reuse the story's topic words."""
    if relates:
        first = str(rng.choice(TOPICS[story_topic]["relate"]))
        second = str(rng.choice(TOPICS[story_topic]["own"]))
    else:
        first = str(rng.choice(DISTANT_REFLECTIONS))
        second = str(rng.choice(FILLER))
    return [first, second]
